"""The recipe application: the typed schema, the strict YAML loader, the
mapping from recipe keys to library calls, the run stages and the run
folder. It calls the library; the library never imports it.
"""
