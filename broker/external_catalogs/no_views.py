"""The view half of pyiceberg's ``Catalog`` for catalogs that serve no views (Icefall's S3 Tables
and Nessie clients): Icefall writes tables only, so these answer "none" and refuse the rest,
once for both."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.typedef import Identifier

if TYPE_CHECKING:
    from pyiceberg.view import View


class NoViews:
    """Mixed in before ``MetastoreCatalog``; ``name`` is the catalog's."""

    name: str

    def list_views(self, namespace: str | Identifier) -> list[Identifier]:
        return []

    def view_exists(self, identifier: str | Identifier) -> bool:
        return False

    def load_view(self, identifier: str | Identifier) -> View:
        raise NotImplementedError(f"catalog {self.name} serves no views")

    def drop_view(self, identifier: str | Identifier) -> None:
        raise NotImplementedError(f"catalog {self.name} serves no views")

    def register_view(self, identifier: str | Identifier, metadata_location: str) -> View:
        raise NotImplementedError(f"catalog {self.name} serves no views")
