"""Text made from the plan: the compose and stack files, the node image's build context, manifests.

Jinja2 templates (tflab's package data) and the schema checks that run before anything is
written. Reads only tflab's own files; imports only `plan`.
"""
