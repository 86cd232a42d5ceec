"""Async tasks' dead letters in the API: list, replay, discard (docs/async.md "Dead letters").

Thin: who sees and who decides is ``governance.dead_letters``. The dead letters live in a
Valkey stream, not the database, so the list pages by entry id (``before``), newest first.
"""

from __future__ import annotations

from typing import Any, cast

from django.http import HttpRequest
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from governance.api.exceptions import StoreUnavailable
from governance.api.serializers import ErrorSerializer
from governance.api.views import HasSwitchyardRole
from governance.audit import Actor
from governance.dead_letters import (
    MAX_PAGE,
    dead_letter_discard,
    dead_letter_replay,
    dead_letters_list,
    is_entry_id,
)
from runtime.valkey_urls import VALKEY_FAILURES

ENTRY_ID_PATTERN = r"[0-9]{1,20}-[0-9]{1,20}"
_UNAVAILABLE = OpenApiResponse(ErrorSerializer, description="Valkey cannot be reached")


class DeadLetterSerializer(serializers.Serializer[Any]):  # reads a DeadLetter
    entry_id = serializers.CharField(help_text="The dead letter's id: replay or discard by it")
    task_id = serializers.CharField()
    endpoint = serializers.CharField(help_text="The synchronous path it runs as")
    model = serializers.CharField()
    use_case_id = serializers.IntegerField(allow_null=True)
    tenant = serializers.CharField(help_text="The tenant's slug at submit")
    priority_class = serializers.CharField()
    error = serializers.CharField(help_text="The last failure, in words")
    attempts = serializers.IntegerField()
    failed_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField(allow_null=True)
    stream = serializers.CharField(help_text="The partition stream a replay puts it back in")


class DeadLetterPageSerializer(serializers.Serializer[Any]):
    next = serializers.URLField(allow_null=True, help_text="The next (older) page; null: none")
    results = DeadLetterSerializer(many=True)


class ReplayedSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    stream_entry_id = serializers.CharField(help_text="The task's new entry in its stream")
    dead_letter = DeadLetterSerializer()


class _ListQuery(serializers.Serializer[Any]):
    count = serializers.IntegerField(required=False, default=50, min_value=1, max_value=MAX_PAGE)
    before = serializers.RegexField(
        ENTRY_ID_PATTERN,
        required=False,
        help_text="Dead letters older than this entry id (the previous page's last)",
    )

    def validate_before(self, value: str) -> str:
        if not is_entry_id(value):
            raise serializers.ValidationError(
                "Not a dead letter's id: each part is at most 2^64-1."
            )
        return value


class DeadLetterListView(APIView):
    """Dead-lettered async tasks, newest first: every tenant's for officers, auditors and
    admins, their own tenants' for developers."""

    permission_classes = (HasSwitchyardRole,)

    @extend_schema(
        parameters=[_ListQuery],
        responses={200: DeadLetterPageSerializer, 503: _UNAVAILABLE},
        summary="List dead-lettered async tasks",
    )
    def get(self, request: Request) -> Response:
        query = _ListQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        count = query.validated_data["count"]
        try:
            page = dead_letters_list(
                user=request.user, count=count, before=query.validated_data.get("before")
            )
        except VALKEY_FAILURES as exc:
            raise StoreUnavailable() from exc
        following = None
        if page.next_before is not None:
            path = f"{request.path}?count={count}&before={page.next_before}"
            following = request.build_absolute_uri(path)
        results = DeadLetterSerializer(page.letters, many=True).data
        return Response({"next": following, "results": results})


def _actor(request: Request) -> Actor:
    return Actor.from_request(cast(HttpRequest, request))


class DeadLetterReplayView(APIView):
    """Put the task back in its stream, attempts reset: at most once per dead letter."""

    permission_classes = (HasSwitchyardRole,)

    @extend_schema(
        request=None,
        responses={200: ReplayedSerializer, 503: _UNAVAILABLE},
        summary="Replay a dead-lettered async task (officers and admins)",
    )
    def post(self, request: Request, entry_id: str) -> Response:
        try:
            replayed = dead_letter_replay(actor=_actor(request), entry_id=entry_id)
        except VALKEY_FAILURES as exc:
            raise StoreUnavailable() from exc
        return Response(
            {
                "task_id": replayed.letter.task_id,
                "stream_entry_id": replayed.stream_entry_id,
                "dead_letter": DeadLetterSerializer(replayed.letter).data,
            }
        )


class DeadLetterDiscardView(APIView):
    """Drop a dead letter for good (its task stays failed)."""

    permission_classes = (HasSwitchyardRole,)

    @extend_schema(
        request=None,
        responses={200: DeadLetterSerializer, 503: _UNAVAILABLE},
        summary="Discard a dead-lettered async task (officers and admins)",
    )
    def post(self, request: Request, entry_id: str) -> Response:
        try:
            letter = dead_letter_discard(actor=_actor(request), entry_id=entry_id)
        except VALKEY_FAILURES as exc:
            raise StoreUnavailable() from exc
        return Response(DeadLetterSerializer(letter).data)
