"""The gateway: the pipeline's admission stage, and the consumer of agents' verdicts.

* admission (handlers.py): every agent's `agent.request.<agent_id>` read in weighted
  fair turns, one consumer per agent (fair_consumer.py, fairshare.py), checked, admitted
  once per request id, refused by the agent's limits (limits/) or handed to the
  classifier;
* feedback (feedback.py): every agent's `agent.feedback.<agent_id>` recorded and
  acknowledged, the agent's scores refreshed shortly after (scoring.py);
* late replays (replay.py): `agent.replay.<agent_id>` answered from the stored chunks.

Callers that do not speak NATS come through the doors (services/doors), which publish
on the agents' subjects; the learning job is the learner's (services/learner).
"""
