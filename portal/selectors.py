"""Reads for the portal pages."""

from __future__ import annotations

from dataclasses import dataclass

from governance.models import Model


@dataclass(frozen=True)
class CatalogueEntry:
    public_id: str
    capabilities: list[str]
    replica_count: int


def model_catalogue() -> list[CatalogueEntry]:
    return [
        CatalogueEntry(
            public_id=model.public_id,
            capabilities=list(model.capabilities),
            replica_count=sum(len(d.replicas) for d in model.deployments.all() if d.active),
        )
        for model in Model.objects.prefetch_related("deployments")
    ]
