"""Governance records in the Django admin. Saves republish the gateway's policy snapshot."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model as DjangoModel
from django.forms import ModelForm
from django.http import HttpRequest

from governance.models import ApiKey, Deployment, Model, Tenant, UseCase
from governance.services import policy_changed


class RepublishOnChange(admin.ModelAdmin):  # type: ignore[type-arg]
    def save_model(
        self, request: HttpRequest, obj: Any, form: ModelForm[Any], change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        policy_changed()

    def save_related(
        self, request: HttpRequest, form: ModelForm[Any], formsets: Any, change: bool
    ) -> None:
        super().save_related(request, form, formsets, change)
        policy_changed()  # many-to-many (allowed models) are saved here, after save_model

    def delete_model(self, request: HttpRequest, obj: DjangoModel) -> None:
        super().delete_model(request, obj)
        policy_changed()


@admin.register(Tenant)
class TenantAdmin(RepublishOnChange):
    list_display = ("slug", "name", "business_unit", "application_id", "environment")
    list_filter = ("environment",)
    search_fields = ("slug", "name", "application_id")


@admin.register(Model)
class ModelAdmin(RepublishOnChange):
    list_display = ("public_id", "capabilities", "timeout_seconds", "max_tokens")
    search_fields = ("public_id",)


@admin.register(Deployment)
class DeploymentAdmin(RepublishOnChange):
    list_display = ("model", "served_name", "node_pool", "active")
    list_filter = ("active", "node_pool")


@admin.register(UseCase)
class UseCaseAdmin(RepublishOnChange):
    list_display = ("slug", "tenant", "kind", "status", "namespace")
    list_filter = ("status", "kind", "namespace")
    search_fields = ("slug", "name", "tenant__slug")
    filter_horizontal = ("allowed_models",)


@admin.register(ApiKey)
class ApiKeyAdmin(RepublishOnChange):
    list_display = ("prefix", "name", "use_case", "status", "expires_at", "last_used_at")
    list_filter = ("status",)
    search_fields = ("prefix", "name")
    # Keys are minted by the portal/API service so the plaintext can be shown once; the admin
    # only inspects and changes status.
    readonly_fields = ("prefix", "key_hash", "last_used_at", "created_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
