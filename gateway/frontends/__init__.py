"""`sluice serve --frontends N`: the supervisor of N server processes, and the channel each uses to ask its siblings."""
