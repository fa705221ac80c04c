"""The chat turns a request becomes, the same for the eval and for anything trained on its
prompts: a task whose documents carry a conversation (MRCR) is that message list; any other
request is one user turn holding the context lm-eval rendered (AIME: "Question: ...\\nAnswer:").

The turns become token ids through the engine tokenizer's ``apply_chat_template``, never
through a rendered string: a byte-level tokenizer has no text for its role tokens.
"""

from __future__ import annotations

import json
from typing import Any

# task YAML ``metadata`` key naming the document field that holds the conversation
MESSAGES_KEY = "chat_messages"


def parse_messages(value: Any) -> list[dict[str, str]]:
    """A message list given as JSON text (openai/mrcr's ``prompt``) or as a list of dicts."""
    msgs = json.loads(value) if isinstance(value, str) else list(value)
    if not msgs or any(not isinstance(m, dict) or "role" not in m or "content" not in m for m in msgs):
        raise ValueError("a conversation must be a non-empty list of {'role', 'content'} messages")
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in msgs]


def chat_turns(context: str, doc: dict | None, messages_field: str | None) -> list[dict[str, str]]:
    """The request's chat: the document's conversation when its task names one, else one user turn."""
    if messages_field:
        if not doc or messages_field not in doc:
            raise ValueError(f"the task reads its conversation from the document field {messages_field!r}, "
                             "which this document lacks")
        return parse_messages(doc[messages_field])
    return [{"role": "user", "content": context}]


def messages_field(task: Any) -> str | None:
    """The field a loaded lm-eval task declares (``metadata: chat_messages: FIELD``), if any."""
    meta = getattr(getattr(task, "config", None), "metadata", None) or {}
    return meta.get(MESSAGES_KEY)


def task_prompts(task: Any) -> list[tuple[dict, list[dict[str, str]]]]:
    """(document, chat turns) of every request of a loaded lm-eval task, rendered by lm-eval
    itself (its prompt template, zero-shot): the prompts exactly as the eval presents them."""
    task.build_all_requests(limit=None, rank=0, world_size=1)
    field = messages_field(task)
    return [(inst.doc, chat_turns(inst.args[0], inst.doc, field)) for inst in task.instances]
