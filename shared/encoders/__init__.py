"""Sentence encoders: the sentence-transformers model resolver (`embeddings`), models
assembled from chunk packages (`packaged`, all-mpnet-base-v2), several encoders side by
side (`concat`) and the ONNX fast encoder that serves single messages (`fast`). Imports
nothing else of `shared`; the classifier, the retriever, the CLI and the offline tools
import it."""
