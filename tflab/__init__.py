"""tflab: one GPU server as a lab of SSH-enabled TensorFlow machines."""

__version__ = "0.1.0"
