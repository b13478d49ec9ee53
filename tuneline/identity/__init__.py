"""What makes two pieces of work the same: every step's key (keys.py; those read from the config, the model and other
keys alone in config_keys.py, which the steps' own code imports) and the one list of settings that do not shape the
weights (settings.py). The version of the code each key holds is the code's content: tuneline.content.code."""
