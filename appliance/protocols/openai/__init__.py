"""OpenAI's inference API (chat and text completions, embeddings, models) over the model client."""
