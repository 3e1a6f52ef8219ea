"""The per-agent semantic answer cache (issue 33).

* `facts`         what two questions must share beyond their meaning (pure)
* `match`         the matching decision: facts, cosine, per-type thresholds (pure)
* `answer_index`  a replica's in-memory entries per agent and the lookup (no I/O)
* `entries`       the Postgres side: entries, the functions that write them, stats,
                  clear, invalidation by the sources an ingest changed
* `listen`        LISTEN for new and dropped entries (NOTIFY from migration 0019)
* `offer`         which finished answers are stored, and the background writer
* `answerer`      the model a request's first step is (the model half of the key)
"""
