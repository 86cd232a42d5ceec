from __future__ import annotations

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render

from portal.selectors import model_catalogue


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "portal/home.html", {"catalogue": model_catalogue()})


class LocalLoginView(auth_views.LoginView):
    """Username/password login: the embedded demo's stand-in for Keycloak SSO."""

    template_name = "registration/login.html"

    def dispatch(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponseBase:
        if not settings.LOCAL_LOGIN_ENABLED:
            raise Http404("Local login is disabled; sign in with SSO.")
        return super().dispatch(request, *args, **kwargs)
