"""Sentence encoders: the sentence-transformers model resolver (`embeddings`) and the
ONNX fast encoder that serves single messages (`fast`). Imports nothing else of
`shared`; the classifier, the retriever, the CLI and the offline tools import it."""
