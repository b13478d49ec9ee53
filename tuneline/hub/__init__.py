"""The Hugging Face Hub: the commit a hub id stands for (cache keys follow it) and publishing the final model."""
