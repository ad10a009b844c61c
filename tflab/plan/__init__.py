"""The lab and its runs as data: topology, GPU split, links, tflab.yaml, tasks, progress lines.

Pure: no files, no processes, no engine. Everything here is a function of its arguments and
is tested against literal values. The lowest layer: it imports no other part of tflab.
"""
