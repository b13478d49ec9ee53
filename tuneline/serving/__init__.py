"""What answers with a trained model, always through the template it was trained on: `tuneline chat` (chat.py),
`tuneline api`, an OpenAI-compatible server (app, engine, openai_request, server, source), and the MLflow model that
`mlflow models serve` runs for a registered version (mlflow_model.py)."""
