"""The doors: every way into the pipeline other than NATS itself, in a worker type of
their own (`doors`) that ops scale apart from the gateway's admission stage.

* gRPC `AskAgent` / `AskAgentStream` / `Feedback`, health and reflection (grpc_*.py);
* HTTP `POST /agents/{agent_id}/feedback`, `/healthz`, `/readyz` (http.py, health.py);
* the OpenAI-compatible `POST /v1/chat/completions` and `GET /v1/models` (openai_door/);
* the operator dashboard (dashboard/);
* their throttle of wrong credentials and of the bytes one agent has parsed (throttle.py).

Each is a NATS client of the pipeline (door.Door, through shared.client): it checks
the caller's bearer token against the agents' records, publishes on the agent's own
subjects on its behalf and follows the answer, as an agent's own NATS client would. The
doors hold no stage, no admission key and no write grant in Postgres.
"""
