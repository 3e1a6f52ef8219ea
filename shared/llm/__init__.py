"""Model-server clients every LLM role shares: the generators' answers, the classifier's
Layer 3 and the retriever's relevance judge. One backend per wire protocol (`ollama`:
Ollama's API; `openai`: an OpenAI-compatible chat server, with llama.cpp's server as a
dialect of it), each able to stream an answer and to pick one of a fixed set of labels
with its own constrained-output mechanism (`choice`). `select` builds the backend the
settings name. Imports `shared.common` only."""
