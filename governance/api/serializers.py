from __future__ import annotations

from rest_framework import serializers

from governance.models import Deployment, Model


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    class Meta:
        model = Deployment
        fields = ("id", "served_name", "replicas", "node_pool", "active")


class ModelSerializer(serializers.ModelSerializer[Model]):
    deployments = DeploymentSerializer(many=True, read_only=True)

    class Meta:
        model = Model
        fields = ("id", "public_id", "capabilities", "timeout_seconds", "max_tokens", "deployments")
