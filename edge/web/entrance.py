"""What the HTTP layer takes from the settings for each request, pushed and never read live.

`Entrance` holds the internal token the admin routes ask for, the largest header block a
request may send, the other entrance a retry is pointed to and what the OpenAPI document
says about the deployment. `build_gateway` makes it from the settings at start; a reload
(`edge.reload.apply_settings`) and a token switch (`Gateway.switch_token`) tell it theirs
through `reconfigure()`, as every other component is told (style.md § The second step: a
component's life in three verbs). A request reads the values the last push left; the
body bounds are Quart's own (`app.config`, `edge.app.configure_limits`).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.settings import Settings


@dataclass(frozen=True)
class DocumentFacts:
    """The settings `/openapi.json` states: it is rebuilt when these change, not per reload."""

    key_header: str  # the rate limit's key header, documented as a request header when set
    public_base_url: str
    max_long_side_px: int  # bounds `hairline_points`' coordinates in the schema


class Entrance:
    token: str  # `X-Internal-Token` on the admin routes and the alert drill
    max_header_bytes: int
    alternative_endpoint: str  # empty: none named
    document: DocumentFacts

    def __init__(self, settings: Settings) -> None:
        self.reconfigure(settings)

    def reconfigure(self, settings: Settings) -> None:
        """Reloaded (or switched) settings: requests that start from now on see them."""
        edge = settings.edge
        self.token = settings.auth.shared_password
        self.max_header_bytes = edge.max_header_bytes
        self.alternative_endpoint = edge.failures.alternative_endpoint
        self.document = DocumentFacts(
            edge.rate_limit.key_header, edge.public_base_url, settings.analysis.max_long_side_px
        )
