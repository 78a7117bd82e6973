"""`GET /v1/models/{id}`: OpenAI's model object for an id the gateway serves (what a chat request may name as its
`model`): a tier's name, `cascade`, or `cascade:<hint>` with any hint a chat request may give there (a named operating
point in any of the spellings the hint parser takes, or a number in (0, 1]); anything else is UnknownModel (404,
`model_not_found`). The id is client text: one past MAX_MODEL_ID_CHARS is unknown without being parsed (UnknownModel
echoes at most 100 characters of it)."""

from __future__ import annotations

from cascade.errors import InvalidRequest, UnknownModel
from cascade.router.policy import ROUTED_MODEL, parse_hint
from cascade.schemas import ModelCard, ModelList

# Twice the longest tier name (config `Name`, 128) would do; any longer id names nothing served here.
MAX_MODEL_ID_CHARS = 256


def model_card(model_id: str, served: ModelList) -> ModelCard:
    """The model object for `model_id` among the `served` models (`ChatService.model_list`), else UnknownModel."""
    if len(model_id) <= MAX_MODEL_ID_CHARS:
        if any(card.id == model_id for card in served.data):
            return ModelCard(id=model_id)
        base, _, alias = model_id.partition(":")
        if base == ROUTED_MODEL and alias.strip():
            try:
                parse_hint(alias, "model")
            except InvalidRequest:
                pass
            else:
                return ModelCard(id=model_id)
    raise UnknownModel(model_id, [card.id for card in served.data])
