"""The kubectl plugin (`kubectl vlm`): the kubernetes client and `api.names` only, no operator code.
"""
