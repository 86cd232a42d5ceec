from __future__ import annotations

from rest_framework import viewsets

from governance.api.serializers import ModelSerializer
from governance.models import Model


class ModelViewSet(viewsets.ReadOnlyModelViewSet[Model]):
    """The model catalogue: every model the fleet offers and where it runs."""

    queryset = Model.objects.prefetch_related("deployments")
    serializer_class = ModelSerializer
    lookup_field = "public_id"
    lookup_value_regex = r"[^/]+"
