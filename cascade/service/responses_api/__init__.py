"""OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`) over the chat request core:

    wire.py     what a client sends (strict Structs)
    items.py    its input items and settings as the chat completion request the core serves
    answer.py   the chat answer as a Response (output items, status, usage)
    stream.py   the chat stream's frames as the Responses API's typed events
    objects.py  the Response object, its items and events (Structs)
    store.py    stored responses: the protocol, the record, the in-process store (Redis: cascade/service/redis/)
    service.py  `ResponsesService`, what the HTTP adapter calls
"""
