"""A task's ``callback_url``, checked where it is submitted (issue 24, defect 5).

bodies.py reads the field (an http(s) URL, from a use case that signs its callbacks); here
its host is resolved, off the event loop and bounded, and the submit refused with a 400 if
it is an internal address the operator has not allowed (runtime/outbound_urls.py: the rule
the workers that send the callback apply again). A name that does not resolve yet is taken.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway import errors
from gateway.async_tasks.bodies import TaskBody, at_index
from runtime import outbound_urls


async def check_callback_urls(
    tasks: Sequence[TaskBody], *, bulk: bool, allowed: Sequence[outbound_urls.Network]
) -> None:
    """A GatewayError (400, ``callback_url``, the body's index in a bulk) for the first task
    whose callback may not be called; each distinct URL is looked up once."""
    checked: set[str] = set()
    for index, task in enumerate(tasks):
        if not task.callback_url or task.callback_url in checked:
            continue
        try:
            await outbound_urls.check_at_registration_async(task.callback_url, allowed)
        except outbound_urls.OutboundRefused as exc:
            error = errors.bad_request(
                f"'callback_url' {exc}.", param="callback_url", code="callback_url_refused"
            )
            raise at_index(error, index) if bulk else error from None
        checked.add(task.callback_url)
