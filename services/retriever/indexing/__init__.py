"""Writing the index: documents, chunking, and ingest into the embedded index or Elasticsearch."""
