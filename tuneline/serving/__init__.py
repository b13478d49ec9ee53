"""`tuneline api`: a trained model served to OpenAI clients, answering through its training template
(`tuneline.chat.Chat`), with LLaMA-Factory's tool formats read back as `tool_calls`."""
