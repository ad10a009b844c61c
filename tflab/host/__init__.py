"""This host, apart from the engine: external commands, threads, signals, ports, the lab folder.

The one subprocess runner (`proc`) and the one fan-out helper (`fanout`) live here. Imports
`plan` and `render`, never the engine.
"""
