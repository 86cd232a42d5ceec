"""The governance officer's pages: a form, then "Review change" (the plan), then "Apply".

Each form becomes one ``Edit`` of the policy file; ``portal.officer.plans`` plans it with
the policy-as-code engine, rehearses it through the services, and applies it only when the
plan is still the one the officer read. Officers and admins only: everyone else gets a 403.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone

from governance.audit import Actor
from governance.models import Deployment, Model, PriorityClass, Tenant, UseCase
from governance.policy_as_code.errors import PolicyInvalid, Problem
from governance.policy_as_code.selectors import policy_current
from governance.prices import currency
from governance.roles import can_govern
from portal.officer.forms import (
    LIMIT_FIELDS,
    ConfirmForm,
    DeploymentForm,
    GuardrailFormSet,
    ModelRecordForm,
    OfficerForm,
    PriorityClassForm,
    PriorityMatrixForm,
    SlaClassForm,
    TenantForm,
    UseCaseForm,
    guardrail_initial,
    matrix_field_name,
)
from portal.officer.lifecycle import RECENT, callers_by_model
from portal.officer.plans import (
    Edit,
    PlanChanged,
    Review,
    current_record,
    lookup,
    problems_by_field,
    review_apply,
    review_build,
)
from portal.officer.prices import price_history, prices_in_force

View = Callable[..., HttpResponse]
USE_CASES_PER_PAGE = 25

# Places in the file (and the services' field names) → the forms' fields.
TENANT_FIELDS = {
    "id": "slug",
    "slug": "slug",
    "name": "name",
    "business_unit": "business_unit",
    "application_id": "application_id",
    "environment": "environment",
    "owner_email": "owner_email",
    "contacts": "contacts",
}
USE_CASE_FIELDS = {
    "id": "slug",
    "slug": "slug",
    "tenant": "tenant",
    "name": "name",
    "kind": "kind",
    "purpose": "purpose",
    "data_classification": "data_classification",
    "namespace": "namespace",
    "ticket_ref": "ticket_ref",
    "models": "models",
    "allowed_models": "models",
    "model_pins": "model_pins",
    "model_fallbacks": "model_fallbacks",
    "guardrail_failure": "guardrail_failure",
    "records.policy": "record_policy",
    "record_policy": "record_policy",
    "records.retention_days": "record_retention_days",
    "record_retention_days": "record_retention_days",
    "records.developers_can_read": "records_visible_to_developers",
    **{f"limits.{name}": name for name in LIMIT_FIELDS},
    **{name: name for name in LIMIT_FIELDS},
}
PRIORITY_CLASS_FIELDS = {name: name for name in PriorityClassForm.base_fields}
MODEL_FIELDS = {
    "id": "public_id",
    **{name: name for name in ModelRecordForm.base_fields},
    **{f"lifecycle.{name}": name for name in ModelRecordForm.base_fields},
}
DEPLOYMENT_FIELDS = {name: name for name in DeploymentForm.base_fields}
SLA_CLASS_FIELDS = {name: name for name in SlaClassForm.base_fields}


def officer_only(view: View) -> View:
    """Signed in, and an officer or an admin; anyone else is refused with a 403."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not can_govern(request.user):
            return render(
                request,
                "portal/refused.html",
                {
                    "message": "Only a governance officer or an admin may change governance "
                    "records.",
                    "back": reverse("portal:dashboard"),
                },
                status=403,
            )
        return view(request, *args, **kwargs)

    return login_required(wrapper)


@dataclass
class Page:
    """What one officer's form page needs: its forms, how they become an edit, where to go."""

    title: str
    form: forms.Form
    edit: Callable[[], Edit]
    field_of: Callable[[str], str | None]
    done: Callable[[], str]
    done_message: Callable[[], str]
    formset: forms.BaseFormSet[Any] | None = None
    template: str = "portal/officer/form.html"
    back: str = ""
    # Where the edited record's problems point, when it is not the edit's whole record (a
    # deployment of a model, an SLA class of a use case); called once the form is valid.
    prefix: Callable[[], str] | None = None
    intro: str = ""  # a sentence under the title
    extra: dict[str, Any] | None = None  # more for the template
    # Whether a problem with a field the form shows but fixes (a price's start) goes under
    # that field, where the rule it breaks is about it, rather than above the form.
    errors_on_fixed_fields: bool = False

    def problem_prefix(self, edit: Edit) -> str:
        return self.prefix() if self.prefix is not None else edit.prefix

    def forms(self) -> list[forms.Form]:
        return [self.form, *(self.formset.forms if self.formset is not None else ())]


def _valid(page: Page) -> bool:
    form_ok = page.form.is_valid()
    formset_ok = page.formset.is_valid() if page.formset is not None else True
    return form_ok and formset_ok


def _show_problems(page: Page, prefix: str, problems: list[Problem]) -> None:
    """The plan's and the services' problems onto the fields they name; the rest above."""
    by_field, rest = problems_by_field(problems, prefix, page.field_of)
    for name, texts in by_field.items():
        fixed = name in page.form.fields and page.form.fields[name].disabled
        if name in page.form.fields and (not fixed or page.errors_on_fixed_fields):
            for text in texts:
                page.form.add_error(name, text)
        else:
            rest.extend(f"{name}: {text}" for text in texts)
    for text in rest:
        page.form.add_error(None, text)


def _step(request: HttpRequest, page: Page) -> HttpResponse:
    for form in page.forms():
        if isinstance(form, OfficerForm):
            form.check_as_you_go(request.path)
    if request.method == "POST" and "validate" in request.GET:
        return _validate(request, page, request.GET["validate"])
    context: dict[str, Any] = {
        "page": page,
        "form": page.form,
        "formset": page.formset,
        **(page.extra or {}),
    }
    if request.method != "POST" or not _valid(page):
        return render(request, page.template, context)
    step = request.POST.get("step", "review")
    if step == "edit":
        return render(request, page.template, context)
    edit = page.edit()
    actor = Actor.from_request(request)
    if step == "apply":
        try:
            review_apply(edit, actor, reviewed=request.POST.get("fingerprint", ""))
        except PlanChanged:
            messages.warning(
                request,
                "The records changed since you reviewed this change: review the plan again.",
            )
        except PolicyInvalid as exc:
            _show_problems(page, page.problem_prefix(edit), list(exc.problems))
            return render(request, page.template, context)
        else:
            messages.success(request, page.done_message())
            return redirect(page.done())
    review = review_build(edit, actor)
    if not review.ok:
        _show_problems(page, page.problem_prefix(edit), review.problems)
        return render(request, page.template, context)
    return _review_page(request, page, review)


def _validate(request: HttpRequest, page: Page, name: str) -> HttpResponse:
    """One field's errors, for htmx to put under it: the same checks as "Review change" (the
    form's, then the plan's and the rehearsed services'), without saving anything."""
    field = next(
        (f[n] for f in page.forms() for n in f.fields if f[n].html_name == name and name), None
    )
    if field is None:
        return HttpResponse("No such field.", status=400, content_type="text/plain")
    if _valid(page):
        edit = page.edit()
        review = review_build(edit, Actor.from_request(request))
        if not review.ok:
            _show_problems(page, page.problem_prefix(edit), review.problems)
    return render(request, "portal/officer/_field_errors.html", {"field": field})


def _review_page(request: HttpRequest, page: Page, review: Review) -> HttpResponse:
    return render(
        request,
        "portal/officer/review.html",
        {"page": page, "form": page.form, "formset": page.formset, "review": review},
    )


def _data(request: HttpRequest) -> Any:
    return request.POST if request.method == "POST" else None


# --- the officer's overview -----------------------------------------------------------------
@officer_only
def governance_home(request: HttpRequest) -> HttpResponse:
    use_cases = UseCase.objects.select_related("tenant").order_by("tenant__slug", "slug")
    return render(
        request,
        "portal/officer/home.html",
        {
            "tenants": Tenant.objects.order_by("slug"),
            "use_cases": Paginator(use_cases, USE_CASES_PER_PAGE).get_page(request.GET.get("page")),
            "priority_classes": PriorityClass.objects.order_by("rank"),
        },
    )


# --- tenants --------------------------------------------------------------------------------
def _tenant_page(request: HttpRequest, tenant: Tenant | None) -> HttpResponse:
    initial = TenantForm.initial_of(tenant) if tenant else {}
    form = TenantForm(_data(request), initial=initial, editing=tenant)

    def edit() -> Edit:
        return Edit("tenants", form.cleaned_data["slug"], form.entry())

    return _step(
        request,
        Page(
            title=f"Edit tenant {tenant.slug}" if tenant else "New tenant",
            form=form,
            edit=edit,
            field_of=lookup(TENANT_FIELDS),
            done=lambda: reverse("portal:governance"),
            done_message=lambda: f"Tenant {form.cleaned_data['slug']} saved.",
            back=reverse("portal:governance"),
        ),
    )


@officer_only
def tenant_new(request: HttpRequest) -> HttpResponse:
    return _tenant_page(request, None)


@officer_only
def tenant_edit(request: HttpRequest, slug: str) -> HttpResponse:
    return _tenant_page(request, get_object_or_404(Tenant, slug=slug))


# --- use cases ------------------------------------------------------------------------------
def _use_case_page(request: HttpRequest, use_case: UseCase | None) -> HttpResponse:
    spec = None
    if use_case is not None:
        spec = next(
            u
            for u in policy_current().use_cases or ()
            if (u.tenant, u.slug) == (use_case.tenant.slug, use_case.slug)
        )
    initial: dict[str, Any] = UseCaseForm.initial_of(spec) if spec else {}
    if use_case is None and (wanted := request.GET.get("tenant")):
        initial["tenant"] = wanted
    form = UseCaseForm(_data(request), initial=initial, editing=spec)
    formset = GuardrailFormSet(
        _data(request), initial=guardrail_initial(spec) if spec else None, prefix="guardrails"
    )

    def edit() -> Edit:
        selections = [f.selection() for f in formset.forms]
        entry = form.entry([s for s in selections if s is not None])
        if spec is not None:  # its SLA classes have their own forms: they stay as they are
            entry["sla_classes"] = (current_record("use_cases", spec.id) or {}).get(
                "sla_classes", []
            )
        return Edit("use_cases", entry["id"], entry, prune=True)

    def done() -> str:
        found = UseCase.objects.get(
            tenant__slug=form.cleaned_data["tenant"], slug=form.cleaned_data["slug"]
        )
        return reverse("portal:use_case_detail", args=[found.pk])

    return _step(
        request,
        Page(
            title=f"Edit use case {use_case}" if use_case else "New use case",
            form=form,
            formset=formset,
            edit=edit,
            field_of=lookup(USE_CASE_FIELDS),
            done=done,
            done_message=lambda: (
                f"Use case {form.cleaned_data['tenant']}/{form.cleaned_data['slug']} saved."
            ),
            template="portal/officer/use_case_form.html",
            extra=(
                {"sla_classes": _sla_classes_of(use_case), "use_case_pk": use_case.pk}
                if use_case
                else None
            ),
            back=(
                reverse("portal:use_case_detail", args=[use_case.pk])
                if use_case
                else reverse("portal:governance")
            ),
        ),
    )


@officer_only
def use_case_new(request: HttpRequest) -> HttpResponse:
    return _use_case_page(request, None)


@officer_only
def use_case_edit(request: HttpRequest, pk: int) -> HttpResponse:
    return _use_case_page(
        request, get_object_or_404(UseCase.objects.select_related("tenant"), pk=pk)
    )


# --- priority classes and the matrix --------------------------------------------------------
def _priority_class_page(request: HttpRequest, pc: PriorityClass | None) -> HttpResponse:
    initial = PriorityClassForm.initial_of(pc) if pc else {}
    form = PriorityClassForm(_data(request), initial=initial, editing=pc)

    def edit() -> Edit:
        return Edit("priority_classes", form.cleaned_data["name"], form.entry(), key="name")

    return _step(
        request,
        Page(
            title=f"Edit priority class {pc.name}" if pc else "New priority class",
            form=form,
            edit=edit,
            field_of=lookup(PRIORITY_CLASS_FIELDS),
            done=lambda: reverse("portal:governance"),
            done_message=lambda: f"Priority class {form.cleaned_data['name']} saved.",
            back=reverse("portal:governance"),
        ),
    )


@officer_only
def priority_class_new(request: HttpRequest) -> HttpResponse:
    return _priority_class_page(request, None)


@officer_only
def priority_class_edit(request: HttpRequest, name: str) -> HttpResponse:
    return _priority_class_page(request, get_object_or_404(PriorityClass, name=name))


@officer_only
def priority_matrix(request: HttpRequest) -> HttpResponse:
    current = policy_current().priority_matrix or {}
    form = PriorityMatrixForm(_data(request), initial=PriorityMatrixForm.initial_of(current))

    def field_of(place: str) -> str | None:
        environment, _, namespace = place.partition(".")
        name = matrix_field_name(environment, namespace)
        return name if name in form.fields else None

    return _step(
        request,
        Page(
            title="Priority matrix",
            form=form,
            edit=lambda: Edit("priority_matrix", "", form.matrix(), prune=True),
            field_of=field_of,
            done=lambda: reverse("portal:governance"),
            done_message=lambda: "Priority matrix saved.",
            template="portal/officer/matrix_form.html",
            back=reverse("portal:governance"),
        ),
    )


# --- models and their deployments -----------------------------------------------------------
def _models_back() -> str:
    return reverse("portal:models")


@officer_only
def models_list(request: HttpRequest) -> HttpResponse:
    """Every model with its deployments: where an officer adds or changes them."""
    models = list(
        Model.objects.select_related("successor")
        .prefetch_related("deployments")
        .order_by("public_id")
    )
    now = timezone.now()
    prices = prices_in_force(models=models, now=now)
    callers = callers_by_model(models, now=now)
    return render(
        request,
        "portal/officer/models.html",
        {
            "models": [
                (model, prices[model.pk], callers.get(model.pk), _versions_of(model))
                for model in models
            ],
            "currency": currency(),
            "recent_days": RECENT.days,
        },
    )


def _versions_of(model: Model) -> list[tuple[str, list[str]]]:
    """The model's versions, each with the served names of its active deployments."""
    versions: dict[str, list[str]] = {}
    for deployment in sorted(model.deployments.all(), key=lambda d: d.served_name):
        if deployment.active and deployment.version:
            versions.setdefault(deployment.version, []).append(deployment.served_name)
    return sorted(versions.items())


def _model_page(request: HttpRequest, model: Model | None) -> HttpResponse:
    initial = ModelRecordForm.initial_of(model) if model else {}
    form = ModelRecordForm(_data(request), initial=initial, editing=model)

    def edit() -> Edit:
        ident = form.cleaned_data["public_id"]
        current = current_record("models", ident) if model is not None else None
        return Edit("models", ident, form.entry(current))

    return _step(
        request,
        Page(
            title=f"Edit model {model.public_id}" if model else "New model",
            form=form,
            edit=edit,
            field_of=lookup(MODEL_FIELDS),
            done=_models_back,
            done_message=lambda: f"Model {form.cleaned_data['public_id']} saved.",
            back=_models_back(),
            intro="" if model else "Add its deployments and prices once it is saved.",
            template="portal/officer/model_form.html",
            extra=(
                {
                    "model": model,
                    "prices": price_history(model=model, now=timezone.now()),
                    "currency": currency(),
                }
                if model
                else None
            ),
        ),
    )


@officer_only
def model_new(request: HttpRequest) -> HttpResponse:
    return _model_page(request, None)


@officer_only
def model_edit(request: HttpRequest, pk: int) -> HttpResponse:
    return _model_page(request, get_object_or_404(Model, pk=pk))


def _deployment_page(
    request: HttpRequest, model: Model, deployment: Deployment | None
) -> HttpResponse:
    initial = DeploymentForm.initial_of(deployment) if deployment else {}
    taken = () if deployment else tuple(model.deployments.values_list("served_name", flat=True))
    form = DeploymentForm(_data(request), initial=initial, editing=deployment, taken=taken)

    def edit() -> Edit:
        current = current_record("models", model.public_id)
        assert current is not None
        mine = form.cleaned_data["served_name"]
        others = [d for d in current.get("deployments", []) if d["served_name"] != mine]
        entry = {**current, "deployments": [*others, form.entry()]}
        return Edit("models", model.public_id, entry)

    return _step(
        request,
        Page(
            title=(
                f"Edit deployment {deployment.served_name} of {model.public_id}"
                if deployment
                else f"New deployment of {model.public_id}"
            ),
            form=form,
            edit=edit,
            field_of=lookup(DEPLOYMENT_FIELDS),
            prefix=lambda: (
                f"models[{model.public_id}].deployments[{form.cleaned_data['served_name']}]"
            ),
            done=_models_back,
            done_message=lambda: (
                f"Deployment {form.cleaned_data['served_name']} of {model.public_id} saved."
            ),
            back=_models_back(),
        ),
    )


@officer_only
def deployment_new(request: HttpRequest, pk: int) -> HttpResponse:
    return _deployment_page(request, get_object_or_404(Model, pk=pk), None)


@officer_only
def deployment_edit(request: HttpRequest, pk: int, deployment_pk: int) -> HttpResponse:
    deployment = get_object_or_404(
        Deployment.objects.select_related("model"), pk=deployment_pk, model_id=pk
    )
    return _deployment_page(request, deployment.model, deployment)


# --- SLA classes of a use case --------------------------------------------------------------
def _sla_classes_of(use_case: UseCase) -> list[dict[str, Any]]:
    """The use case's SLA classes as the policy file writes them (for its officer page)."""
    record = current_record("use_cases", f"{use_case.tenant.slug}/{use_case.slug}") or {}
    return [
        {**c, "windows_text": SlaClassForm.initial_of(c)["windows"]}
        for c in record.get("sla_classes", [])
    ]


def _sla_class_page(
    request: HttpRequest, pk: int, name: str | None, *, delete: bool = False
) -> HttpResponse:
    use_case = get_object_or_404(UseCase.objects.select_related("tenant"), pk=pk)
    ident = f"{use_case.tenant.slug}/{use_case.slug}"
    current = current_record("use_cases", ident)
    assert current is not None
    classes: list[dict[str, Any]] = list(current.get("sla_classes", []))
    existing = next((c for c in classes if c["name"] == name), None)
    if name is not None and existing is None:
        raise Http404("No such SLA class.")
    back = reverse("portal:use_case_edit", args=[use_case.pk]) + "#sla-classes"
    form: OfficerForm
    if delete:
        form = ConfirmForm(_data(request))
    else:
        form = SlaClassForm(
            _data(request),
            initial=SlaClassForm.initial_of(existing) if existing else {},
            editing=existing,
            taken=() if existing else tuple(c["name"] for c in classes),
        )

    def chosen() -> str:
        return name if name is not None else str(form.cleaned_data["name"])

    def edit() -> Edit:
        kept = [c for c in classes if c["name"] != chosen()]
        if not delete:
            assert isinstance(form, SlaClassForm)
            kept.append(form.entry())
        return Edit("use_cases", ident, {**current, "sla_classes": kept}, prune=True)

    if delete:
        title, verb = f"Delete SLA class {name} of {ident}", "deleted"
    elif existing:
        title, verb = f"Edit SLA class {name} of {ident}", "saved"
    else:
        title, verb = f"New SLA class for {ident}", "saved"
    return _step(
        request,
        Page(
            title=title,
            form=form,
            edit=edit,
            field_of=lookup(SLA_CLASS_FIELDS),
            prefix=lambda: f"use_cases[{ident}].sla_classes[{chosen()}]",
            done=lambda: back,
            done_message=lambda: f"SLA class {chosen()} of {ident} {verb}.",
            back=back,
            intro=(
                "Files already registered under it keep their promise; a class that files "
                "use cannot be deleted (change its kinds or windows instead)."
                if delete
                else ""
            ),
        ),
    )


@officer_only
def sla_class_new(request: HttpRequest, pk: int) -> HttpResponse:
    return _sla_class_page(request, pk, None)


@officer_only
def sla_class_edit(request: HttpRequest, pk: int, name: str) -> HttpResponse:
    return _sla_class_page(request, pk, name)


@officer_only
def sla_class_delete(request: HttpRequest, pk: int, name: str) -> HttpResponse:
    return _sla_class_page(request, pk, name, delete=True)
