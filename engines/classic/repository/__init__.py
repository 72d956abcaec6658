"""The model repository on disk: Triton layout, config.pbtxt, names, uploaded files."""
