"""A trained run as a standalone model: merged weights, a chat template that renders as training encoded, an Ollama
Modelfile."""
