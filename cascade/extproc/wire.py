"""What the model picker and Envoy agree on: the path the picker decides for and the headers it reads and sets.

The picker (picker.py) reads them on each request; the Envoy bootstrap (cascade/deploy/envoy.py) forwards the
request headers the picker reads, routes on the ones it sets, and matches the chat path.
"""

from __future__ import annotations

CHAT_PATH = "/v1/chat/completions"  # the only path the picker decides for
TIER_HEADER = "x-cascade-tier"  # set by the picker: the tier Envoy's routes send the request to
VIA_HEADER = "x-cascade-via"  # set by the picker to "gateway": the request goes to a `cascade serve` behind Envoy
HINT_HEADER = "x-cascade-quality"  # read by the picker: the client's quality hint, as `cascade serve` reads it
