"""Offline tools of the retriever, apart from the worker: retrieval quality on a BEIR
set (`evaluation`), the relevance check's calibration (`relevance_calibration`)."""
