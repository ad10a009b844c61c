"""Running tasks across a lab: the run's pure state machine, the launcher, exec sessions, run.json.

Drives nodes only through the engine's executors.
"""
