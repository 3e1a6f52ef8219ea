"""Offline tools of the retriever, apart from the worker (`services.retriever` never
imports them): retrieval quality on a BEIR set (`evaluation`, `beir`, `ranking_metrics`),
the relevance check's calibration (`relevance_calibration`) and the fusion's
cross-validation (`fusion_cv`)."""
