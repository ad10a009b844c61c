"""The only code that talks to Docker: images, containers, exec, copies, compose and swarm labs.

Compose labs and swarm labs answer the same verbs through one interface (`backend.LabBackend`).
Nothing here prints: progress goes to callbacks, errors are raised.
"""
