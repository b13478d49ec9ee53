"""The offline demo: tiny text and vision-language models and the bundled datasets, built without a hub."""
