"""The model names the OpenAI door serves one agent, pure: `GET /v1/models` lists them, a
chat request's `model` must be one of them.

* `intentroute`: the classifier decides the route (every agent);
* `intentroute/<QUERY_TYPE>`: a declared route, honoured for trusted agents as on the
  other doors (every agent);
* a fleet model, `backend/model`, that the agent's policy lets it choose (`intentroute
  agent set NAME models=cloud/big-1,...`): the request's `AgentRequest.model`, the
  first step of the slot's chain; routing and the rest of the agent's chain still apply.

Anything else is UNKNOWN_MODEL, 404 `model_not_found` as OpenAI answers a model it does
not serve. The policy is read per request through the doors' policy cache, so an
`agent set ... models=` reaches the door within POLICY_REFRESH. Whether the fleet
serves an allowed model is the generator's to say (it holds the fleet): its refusal is
the same error, before any text.
"""

from __future__ import annotations

import msgspec

from shared.contracts.errors import UnknownModelError
from shared.contracts.routing import QueryType
from shared.policy.agent import AgentPolicy
from shared.policy.chain import check_asked

MODEL = "intentroute"
ROUTE_MODELS = {f"{MODEL}/{t.value}": t.value for t in QueryType}
OWNER = "intentroute"


class ModelCard(msgspec.Struct, frozen=True):
    id: str
    object: str
    created: int
    owned_by: str


class ModelList(msgspec.Struct, frozen=True):
    object: str
    data: list[ModelCard]


def names(policy: AgentPolicy) -> list[str]:
    """The names an agent with `policy` may send as `model`, the routed ones first."""
    return list(dict.fromkeys([MODEL, *ROUTE_MODELS, *policy.models]))


def model_list(created: int, policy: AgentPolicy) -> ModelList:
    """`GET /v1/models` for an agent with `policy`."""
    return ModelList("list", [card(name, created) for name in names(policy)])


def card(name: str, created: int) -> ModelCard:
    owner = OWNER if name == MODEL or name in ROUTE_MODELS else name.partition("/")[0]
    return ModelCard(name, "model", created, owner)


def find(name: str, created: int, policy: AgentPolicy) -> ModelCard:
    """`GET /v1/models/{name}`; UnknownModelError when the agent may not use it."""
    if name in names(policy):
        return card(name, created)
    raise UnknownModelError(f"no model {name!r} for this agent")


def resolve(name: str, policy: AgentPolicy) -> tuple[str | None, str]:
    """A chat request's `model`: (the route it declares, None for none; the fleet model
    it names, "" for none). UnknownModelError when it is none of `names(policy)`."""
    if name == MODEL:
        return None, ""
    if name in ROUTE_MODELS:
        return ROUTE_MODELS[name], ""
    if "/" not in name:
        raise UnknownModelError(f"model {name!r} is not one this door serves: "
                                f"{MODEL!r}, {MODEL}/<QUERY_TYPE>, or a model of this "
                                "agent's (GET /v1/models)")
    check_asked(name, policy)
    return None, name
