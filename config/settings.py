"""Django settings, read from environment variables (12-factor) with safe embedded defaults.

``SWITCHYARD_MODE=embedded`` (the default) is the one-machine demo: SQLite, a local Valkey,
local password login. ``SWITCHYARD_MODE=production`` refuses to start without an explicit
secret key, turns DEBUG and local login off, and expects PostgreSQL, a Valkey URL and Keycloak.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

import dj_database_url

# The module, not its DEFAULT_VALKEY_URL: every upper-case name here is a Django setting.
from runtime import valkey_urls
from runtime.env import (
    ConfigurationError,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_required,
    env_str,
)
from runtime.outbound_urls import allowed_networks_from_env
from runtime.valkey_urls import for_channels, for_kombu, for_valkey_py, kombu_transport_options

BASE_DIR = Path(__file__).resolve().parent.parent
RUN_DIR = Path(env_str("SWITCHYARD_RUN_DIR", str(BASE_DIR / ".run")))

MODE = env_choice("SWITCHYARD_MODE", "embedded", ("embedded", "production"))
PRODUCTION = MODE == "production"

if PRODUCTION:
    SECRET_KEY = env_required("SWITCHYARD_SECRET_KEY")
else:
    # A fixed, clearly-labelled key is fine for the embedded demo: nothing it signs leaves
    # the machine, and production refuses to start without a real one.
    SECRET_KEY = env_str("SWITCHYARD_SECRET_KEY", "embedded-demo-only-not-secret-" + "x" * 20)

DEBUG = env_bool("SWITCHYARD_DEBUG", not PRODUCTION)
if PRODUCTION and DEBUG:
    raise ConfigurationError(
        "SWITCHYARD_DEBUG=true is refused in production mode: DEBUG pages show settings, "
        "source and SQL to whoever triggers an error"
    )
ALLOWED_HOSTS = env_list(
    "SWITCHYARD_ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]"]
)
CSRF_TRUSTED_ORIGINS = env_list("SWITCHYARD_CSRF_TRUSTED_ORIGINS", [])
# How many reverse proxies in front of the web process append to X-Forwarded-For: the audit
# takes the Nth address from the right as the client's; 0 takes the peer (REMOTE_ADDR).
TRUSTED_PROXY_HOPS = env_int("SWITCHYARD_TRUSTED_PROXY_HOPS", 0, minimum=0)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "django_htmx",
    "governance",
    "portal",
    "scheduler",
    "records",
    "ops",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",  # request.htmx: partial answers to htmx calls
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.switchyard",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        env_str("SWITCHYARD_DATABASE_URL", f"sqlite:///{RUN_DIR / 'switchyard.sqlite3'}"),
        conn_max_age=env_int("SWITCHYARD_DATABASE_CONN_MAX_AGE", 0, minimum=0),
    )
}
if PRODUCTION and DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    raise ConfigurationError(
        "production mode refuses SQLite (one writer, no failover, the audit trail on a local "
        "file): set SWITCHYARD_DATABASE_URL to PostgreSQL, e.g. postgres://user:pw@host/db"
    )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # WAL lets the web process, the Celery worker and the seeder write without lock errors.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Tests use a file too, not shared-cache memory, whose table locks ignore the busy
    # timeout: concurrency tests then see what production's SQLite would do.
    # The process id keeps concurrent test runs in one checkout from sharing a database.
    DATABASES["default"]["TEST"] = {"NAME": str(RUN_DIR / f"test-switchyard-{os.getpid()}.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("SWITCHYARD_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# Production serves collected files (collectstatic); the embedded demo serves them from the apps.
STATIC_ROOT = (
    Path(env_str("SWITCHYARD_STATIC_ROOT", str(BASE_DIR / "staticfiles"))) if PRODUCTION else None
)
MEDIA_ROOT = Path(env_str("SWITCHYARD_MEDIA_ROOT", str(RUN_DIR / "media")))
MEDIA_URL = "media/"
STORAGES: dict[str, dict[str, object]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"
        if PRODUCTION
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = not PRODUCTION

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"
# Local username/password login exists for the embedded demo only.
LOCAL_LOGIN_ENABLED = env_bool("SWITCHYARD_LOCAL_LOGIN", not PRODUCTION)

# --- Object storage: records and files (django-storages' S3 backend, or the filesystem) ------
# The embedded stack runs SeaweedFS (ops/seaweed.py) at SWITCHYARD_S3_ENDPOINT_URL with the
# demo identity below; production points the same settings at AWS S3, MinIO, Ceph or any
# S3-compatible store (leave the endpoint empty for AWS, and the keys empty to use the
# instance's or pod's own credentials). "filesystem" is for the smallest installs.
OBJECT_STORAGE = env_choice("SWITCHYARD_OBJECT_STORAGE", "s3", ("s3", "filesystem"))
S3_ENDPOINT_URL = env_str(
    "SWITCHYARD_S3_ENDPOINT_URL", "" if PRODUCTION else "http://127.0.0.1:8333"
)
S3_ACCESS_KEY_ID = env_str("SWITCHYARD_S3_ACCESS_KEY_ID", "" if PRODUCTION else "switchyard-demo")
S3_SECRET_ACCESS_KEY = env_str(
    "SWITCHYARD_S3_SECRET_ACCESS_KEY", "" if PRODUCTION else "embedded-demo-only-s3-secret"
)
S3_REGION = env_str("SWITCHYARD_S3_REGION", "us-east-1")
RECORDS_BUCKET = env_str("SWITCHYARD_RECORDS_BUCKET", "switchyard-records")
OBJECT_STORAGE_DIR = Path(env_str("SWITCHYARD_OBJECT_STORAGE_DIR", str(RUN_DIR / "objects")))


def _object_storage(bucket: str) -> dict[str, object]:
    if OBJECT_STORAGE == "filesystem":
        return {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            # Object names are deterministic: a rewrite is a retry, as with file_overwrite below.
            "OPTIONS": {"location": str(OBJECT_STORAGE_DIR / bucket), "allow_overwrite": True},
        }
    return {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": bucket,
            "endpoint_url": S3_ENDPOINT_URL or None,
            "access_key": S3_ACCESS_KEY_ID or None,
            "secret_key": S3_SECRET_ACCESS_KEY or None,
            "region_name": S3_REGION,
            "signature_version": "s3v4",
            "addressing_style": "path",
            "file_overwrite": True,  # object names are deterministic: a rewrite is a retry
            "default_acl": None,
            "querystring_auth": True,
        },
    }


STORAGES["records"] = _object_storage(RECORDS_BUCKET)
# Uploaded originals and every file job's outputs (docs/files.md).
FILES_BUCKET = env_str("SWITCHYARD_FILES_BUCKET", "switchyard-files")
STORAGES["files"] = _object_storage(FILES_BUCKET)

# --- Records: envelope encryption of content (records/sealing.py) ------------------------
# "kid:base64(32 bytes)" pairs, comma-separated; the first seals new objects, every one opens
# old ones (rotation: put the new key first, keep the old ones until nothing sealed by them
# is left). Production refuses to start without one; the embedded demo derives one.
if PRODUCTION:
    RECORDS_KEYS = env_required("SWITCHYARD_RECORDS_KEYS")
else:
    RECORDS_KEYS = env_str("SWITCHYARD_RECORDS_KEYS", "")
# Interaction records of a use case id no longer in governance (deleted, or a standalone
# gateway's) are kept this long; a use case's own record_retention_days applies otherwise.
RECORD_RETENTION_DAYS = env_int("SWITCHYARD_RECORD_RETENTION_DAYS", 90, minimum=1)

# --- Async tasks (docs/async.md) -------------------------------------------------------------
# How long a queued task may wait before it is dropped: the gateway's own variable, read here
# too because a replayed dead letter starts a fresh queue lifetime (governance/dead_letters.py).
ASYNC_QUEUE_TTL_SECONDS = env_int("SWITCHYARD_ASYNC_QUEUE_TTL_SECONDS", 3600, minimum=1)

# --- File work: the feasibility model (docs/files.md) ----------------------------------------
# The share of a model's measured capacity batch (file) work may be promised.
BATCH_CAPACITY_SHARE = env_float("SWITCHYARD_BATCH_CAPACITY_SHARE", 0.3, minimum=0.01)
# Tokens per second assumed for a model before the fleet watcher has measured it: low on
# purpose (one small replica), so that early promises are kept. Per model: "model=tps,...".
BATCH_DEFAULT_TOKENS_PER_SECOND = env_float(
    "SWITCHYARD_BATCH_DEFAULT_TOKENS_PER_SECOND", 200.0, minimum=0.001
)
BATCH_MODEL_TOKENS_PER_SECOND = {
    name.strip(): float(rate)
    for name, _, rate in (
        item.partition("=") for item in env_list("SWITCHYARD_BATCH_MODEL_TOKENS_PER_SECOND", [])
    )
    if name.strip() and rate
}
# How a declared file size becomes estimated tokens.
FILE_TOKENS_PER_AUDIO_SECOND = env_float("SWITCHYARD_FILE_TOKENS_PER_AUDIO_SECOND", 25.0)
FILE_TOKENS_PER_PAGE = env_float("SWITCHYARD_FILE_TOKENS_PER_PAGE", 800.0)
FILE_TOKENS_PER_LINE = env_float("SWITCHYARD_FILE_TOKENS_PER_LINE", 600.0)
FILE_BYTES_PER_TOKEN = env_float("SWITCHYARD_FILE_BYTES_PER_TOKEN", 4.0, minimum=0.1)
# --- The OpenAI Batch API (/v1/files, /v1/batches; docs/files.md) ---------------------------
# An input file's largest size (OpenAI's own limit: 200 MB) and request count (OpenAI: 50,000).
BATCH_MAX_FILE_BYTES = env_int("SWITCHYARD_BATCH_MAX_FILE_BYTES", 200 * 1024 * 1024, minimum=1)
BATCH_MAX_LINES = env_int("SWITCHYARD_BATCH_MAX_LINES", 50_000, minimum=1)
# The gateway file jobs call through (their admission, priority and limits are the gateway's):
# its base URL, and the secret their per-SLA-class keys are derived from (governance/job_keys.py).
FILE_JOBS_GATEWAY_URL = env_str("SWITCHYARD_FILE_JOBS_GATEWAY_URL", "http://127.0.0.1:8080")
if PRODUCTION:
    JOB_KEY_SECRET = env_required("SWITCHYARD_JOB_KEY_SECRET")
else:
    JOB_KEY_SECRET = env_str(
        "SWITCHYARD_JOB_KEY_SECRET",
        hashlib.sha256(b"switchyard-job-keys-demo:" + SECRET_KEY.encode()).hexdigest(),
    )
# --- Model prices and spend (docs/portal.md "Spend") ----------------------------------------
# The company's currency (ISO 4217): every model price is entered in it and spend shown in it.
CURRENCY = env_str("SWITCHYARD_CURRENCY", "EUR")
if not (len(CURRENCY) == 3 and CURRENCY.isascii() and CURRENCY.isalpha() and CURRENCY.isupper()):
    raise ConfigurationError(
        f"SWITCHYARD_CURRENCY must be an ISO 4217 code such as EUR, not {CURRENCY!r}"
    )
# --- File jobs: dispatcher, runner and webhooks (docs/files.md, "Jobs") ----------------------
# Jobs running at once across all workers, and parts of one job running at once.
FILE_JOBS_CONCURRENCY = env_int("SWITCHYARD_FILE_JOBS_CONCURRENCY", 4, minimum=1)
FILE_JOB_PART_CONCURRENCY = env_int("SWITCHYARD_FILE_JOB_PART_CONCURRENCY", 4, minimum=1)
# The feasibility model plans a job's work from this long after now: its upload waits for the
# beat's consumer and then its dispatcher (scheduler/schedules.py), one period each at worst.
FILE_JOBS_START_LAG_SECONDS = env_float(
    "SWITCHYARD_FILE_JOBS_START_LAG_SECONDS",
    env_float("SWITCHYARD_FILE_UPLOADS_POLL_SECONDS", 2.0, minimum=0.1)
    + env_float("SWITCHYARD_FILE_JOBS_DISPATCH_SECONDS", 2.0, minimum=0.1),
    minimum=0.0,
)
# A running job's lease: a worker that stops renewing it for this long is taken for dead.
FILE_JOB_LEASE_SECONDS = env_float("SWITCHYARD_FILE_JOB_LEASE_SECONDS", 30.0, minimum=1.0)
# Attempts of a part that keeps meeting 429/503/connection errors, and the longest backoff.
FILE_JOB_PART_ATTEMPTS = env_int("SWITCHYARD_FILE_JOB_PART_ATTEMPTS", 5, minimum=1)
# Attempts at planning a job (reading the whole file) that raise or kill their worker, before
# the file fails: one bad file must not come back on every dispatch.
FILE_JOB_PLAN_ATTEMPTS = env_int("SWITCHYARD_FILE_JOB_PLAN_ATTEMPTS", 3, minimum=1)
FILE_JOB_RETRY_MAX_SECONDS = env_float("SWITCHYARD_FILE_JOB_RETRY_MAX_SECONDS", 60.0, minimum=0.0)
# How long one call of a part may take (a long audio segment on a busy fleet).
FILE_JOBS_GATEWAY_TIMEOUT_SECONDS = env_float(
    "SWITCHYARD_FILE_JOBS_GATEWAY_TIMEOUT_SECONDS", 300.0, minimum=1.0
)
# Webhook deliveries: attempts (exponential backoff between them) and each one's timeout.
WEBHOOK_ATTEMPTS = env_int("SWITCHYARD_WEBHOOK_ATTEMPTS", 8, minimum=1)
WEBHOOK_TIMEOUT_SECONDS = env_float("SWITCHYARD_WEBHOOK_TIMEOUT_SECONDS", 10.0, minimum=0.1)
# Webhooks and async callbacks never reach loopback, private, link-local (cloud metadata),
# multicast or reserved addresses (runtime/outbound_urls.py), except in the networks named
# here: comma-separated CIDRs for an operator's internal receiver. Empty by default.
WEBHOOK_ALLOWED_NETWORKS = allowed_networks_from_env()
# The S3 endpoint (s3endpoint/): where clients upload registered files over the S3 protocol.
S3_ENDPOINT_PUBLIC_URL = env_str("SWITCHYARD_S3_ENDPOINT_PUBLIC_URL", "http://127.0.0.1:9000")
# --- the S3 endpoint's own settings (s3endpoint/, docs/files.md "The S3 endpoint") ---
S3_ENDPOINT_HOST = env_str("SWITCHYARD_S3_ENDPOINT_HOST", "127.0.0.1")
S3_ENDPOINT_PORT = env_int("SWITCHYARD_S3_ENDPOINT_PORT", 9000, minimum=1)
# Presigned URLs are signed with a credential derived from this (scheduler/files/s3_credentials.py).
S3_PRESIGN_SECRET = env_str("SWITCHYARD_S3_PRESIGN_SECRET", "")
# How long the endpoint trusts a credential it looked up: a revocation takes this long at most.
S3_CREDENTIAL_CACHE_SECONDS = env_float("SWITCHYARD_S3_CREDENTIAL_CACHE_SECONDS", 10.0, minimum=0)
# Browser origins allowed to PUT to presigned URLs (CORS); the portal's own by default.
S3_ENDPOINT_CORS_ORIGINS = env_list(
    "SWITCHYARD_S3_ENDPOINT_CORS_ORIGINS", ["http://127.0.0.1:8000"]
)
# A multipart upload left unfinished this long is aborted and its registration freed
# (scheduler/files/upload_expiry.py, run by beat).
S3_MULTIPART_MAX_AGE_SECONDS = env_float(
    "SWITCHYARD_S3_MULTIPART_MAX_AGE_SECONDS", 24 * 3600.0, minimum=0.0
)
# --- end of the S3 endpoint's settings ---

# --- Valkey: policy snapshot, limits, queues, streams, Celery broker, Channels layer ---------
# One server, Sentinel or Cluster, by URL (runtime/valkey_urls.py, docs/valkey-ha.md). Celery
# and the Channels layer cannot use a Cluster: with a cluster URL they take their own URL.
try:
    VALKEY_URL = for_valkey_py(env_str("SWITCHYARD_VALKEY_URL", valkey_urls.DEFAULT_VALKEY_URL))
    CELERY_VALKEY_URL = for_valkey_py(env_str("SWITCHYARD_CELERY_BROKER_URL", VALKEY_URL))
    CHANNELS_VALKEY_URL = for_valkey_py(env_str("SWITCHYARD_CHANNELS_VALKEY_URL", VALKEY_URL))
    _CELERY_SETTING = (
        "SWITCHYARD_CELERY_BROKER_URL"
        if os.environ.get("SWITCHYARD_CELERY_BROKER_URL")
        else "SWITCHYARD_VALKEY_URL"
    )
    CELERY_BROKER_URL = for_kombu(CELERY_VALKEY_URL, _CELERY_SETTING)
    _CHANNELS_SETTING = (
        "SWITCHYARD_CHANNELS_VALKEY_URL"
        if os.environ.get("SWITCHYARD_CHANNELS_VALKEY_URL")
        else "SWITCHYARD_VALKEY_URL"
    )
    _CHANNELS_HOSTS = for_channels(CHANNELS_VALKEY_URL, _CHANNELS_SETTING)
except ValueError as exc:
    raise ConfigurationError(str(exc)) from exc

CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ACKS_LATE = True  # a worker killed mid-job leaves the job for another worker
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 3600,
    **kombu_transport_options(CELERY_VALKEY_URL),  # Sentinel: the service's name
}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = kombu_transport_options(CELERY_VALKEY_URL)
CELERY_TIMEZONE = TIME_ZONE

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_valkey.core.ValkeyChannelLayer",
        "CONFIG": {"hosts": _CHANNELS_HOSTS, "capacity": 1000},
    }
}

REST_FRAMEWORK = {
    # Sessions for the portal; Keycloak service-account JWTs for automation (DRF's own
    # tokens, plaintext in the database and never expiring, are not used).
    # The first class's challenge decides a 401 (with WWW-Authenticate) over a bare 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "governance.api.authentication.ServiceAccountJWTAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": [
        "governance.api.filtersets.FilterBackend",
        "rest_framework.filters.SearchFilter",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "governance.api.schema.AutoSchema",  # + the error responses
    "EXCEPTION_HANDLER": "governance.api.exceptions.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Switchyard governance API",
    "DESCRIPTION": "Tenants, use cases, models, policies, API keys and the audit trail.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Two fields named "action": a guardrail selection's mode and what a finding records.
    "ENUM_NAME_OVERRIDES": {
        "GuardrailModeEnum": "governance.choices.GuardrailAction",
        "GuardrailFindingActionEnum": "records.models.GuardrailFinding.Action",
        "FileKindEnum": "governance.choices.FileKind",
        # API keys and S3 credentials share their statuses.
        "ApiKeyStatusEnum": "governance.choices.ApiKeyStatus",
    },
}

# --- Single sign-on (OIDC / Keycloak) ---------------------------------------------------------
# SSO is on when a client id is set. Endpoints follow Keycloak's layout under the realm URL
# (the issuer); each can be overridden for another OpenID Connect provider. See docs/sso.md.
SSO_ISSUER = env_str("SWITCHYARD_OIDC_ISSUER", "").rstrip("/")
OIDC_RP_CLIENT_ID = env_str("SWITCHYARD_OIDC_CLIENT_ID", "")
SSO_ENABLED = bool(OIDC_RP_CLIENT_ID)
if SSO_ENABLED and not SSO_ISSUER:
    raise ConfigurationError(
        "SWITCHYARD_OIDC_CLIENT_ID is set, so SWITCHYARD_OIDC_ISSUER must be too "
        "(the realm URL, e.g. https://keycloak.example.com/realms/switchyard)"
    )
OIDC_RP_CLIENT_SECRET = env_required("SWITCHYARD_OIDC_CLIENT_SECRET") if SSO_ENABLED else ""


def _realm_endpoint(variable: str, path: str) -> str:
    default = f"{SSO_ISSUER}/protocol/openid-connect/{path}" if SSO_ISSUER else ""
    return env_str(variable, default)


OIDC_OP_AUTHORIZATION_ENDPOINT = _realm_endpoint("SWITCHYARD_OIDC_AUTHORIZATION_ENDPOINT", "auth")
OIDC_OP_TOKEN_ENDPOINT = _realm_endpoint("SWITCHYARD_OIDC_TOKEN_ENDPOINT", "token")
OIDC_OP_USER_ENDPOINT = _realm_endpoint("SWITCHYARD_OIDC_USERINFO_ENDPOINT", "userinfo")
OIDC_OP_JWKS_ENDPOINT = _realm_endpoint("SWITCHYARD_OIDC_JWKS_ENDPOINT", "certs")
SSO_END_SESSION_ENDPOINT = _realm_endpoint("SWITCHYARD_OIDC_END_SESSION_ENDPOINT", "logout")
OIDC_RP_SCOPES = env_str("SWITCHYARD_OIDC_SCOPES", "openid email profile")
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_USE_PKCE = True
OIDC_VERIFY_SSL = env_bool("SWITCHYARD_OIDC_VERIFY_SSL", True)
OIDC_TIMEOUT = env_int("SWITCHYARD_OIDC_TIMEOUT_SECONDS", 10, minimum=1)
# The ID token is kept for logout: Keycloak ends its own session given id_token_hint.
OIDC_STORE_ID_TOKEN = True
OIDC_OP_LOGOUT_URL_METHOD = "portal.sso.provider_logout_url"
OIDC_AUTHENTICATE_CLASS = "portal.sso.SSOAuthenticationRequestView"
OIDC_CALLBACK_CLASS = "portal.sso.SSOCallbackView"
# Where the roles are in the claims (a dotted path: realm_access.roles, groups,
# resource_access.<client>.roles) and how their values map to Switchyard's roles.
SSO_ROLE_CLAIM = env_str("SWITCHYARD_OIDC_ROLE_CLAIM", "realm_access.roles")
_role_names = ("officer", "developer", "auditor", "admin")
SSO_ROLE_MAP: dict[str, str] = {}
for _pair in env_list("SWITCHYARD_OIDC_ROLE_MAP", [f"{name}={name}" for name in _role_names]):
    _claimed, _, _role = (part.strip() for part in _pair.partition("="))
    if not _claimed or _role not in _role_names:
        raise ConfigurationError(
            f"SWITCHYARD_OIDC_ROLE_MAP entry {_pair!r} must be CLAIM_VALUE=ROLE with ROLE one of "
            + ", ".join(_role_names)
        )
    SSO_ROLE_MAP[_claimed] = _role
SSO_GROUPS_CLAIM = env_str("SWITCHYARD_OIDC_GROUPS_CLAIM", "groups")
SSO_TENANT_GROUP_PREFIX = env_str("SWITCHYARD_OIDC_TENANT_GROUP_PREFIX", "/tenants/")
# Service-account JWTs (client-credentials grant) on /api/: on whenever an issuer is set.
SSO_API_ENABLED = bool(SSO_ISSUER)
SSO_API_AUDIENCE = env_str("SWITCHYARD_OIDC_API_AUDIENCE", "switchyard-api")
SSO_API_CLIENTS = env_list("SWITCHYARD_OIDC_API_CLIENTS", [])
SSO_API_LEEWAY_SECONDS = env_int("SWITCHYARD_OIDC_API_LEEWAY_SECONDS", 30, minimum=0)
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("SWITCHYARD_OIDC_RENEW_SECONDS", 900, minimum=60)
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]
if SSO_ENABLED:
    AUTHENTICATION_BACKENDS.insert(0, "portal.auth.SwitchyardOIDCBackend")
    # An SSO session renews its ID token silently (prompt=none) this often; every renewal
    # signs in again, which re-reads the roles and tenants from the claims (portal/auth.py),
    # so a role removed in Keycloak is gone from the portal within this time.
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
        "mozilla_django_oidc.middleware.SessionRefresh",
    )
    if not LOCAL_LOGIN_ENABLED:
        # No password sign-in anywhere, the admin's form included; the SSO backend (a
        # ModelBackend) still answers permission checks.
        AUTHENTICATION_BACKENDS.remove("django.contrib.auth.backends.ModelBackend")
        LOGIN_URL = "/oidc/authenticate/"

# --- API keys --------------------------------------------------------------------------------
API_KEY_MAX_LIFETIME_DAYS = env_int("SWITCHYARD_API_KEY_MAX_LIFETIME_DAYS", 365, minimum=1)
# How long a rotated key keeps working beside its successor, so clients can roll over.
API_KEY_ROTATION_GRACE_SECONDS = env_int(
    "SWITCHYARD_API_KEY_ROTATION_GRACE_SECONDS", 86400, minimum=0
)

# --- Retention of the usage roll-ups and admission decisions (0 keeps them forever) -------
# The audit trail, refusal summaries included, is append-only and never deleted.
USAGE_RETENTION_DAYS = env_int("SWITCHYARD_USAGE_RETENTION_DAYS", 400, minimum=0)
DECISION_RETENTION_DAYS = env_int("SWITCHYARD_DECISION_RETENTION_DAYS", 90, minimum=0)

# --- Anchoring the audit chain outside the database (governance/anchors.py) ----------------
# The key signs checkpoints of the chain's head; the database must never hold it. Production
# refuses to start without one (give it as SWITCHYARD_AUDIT_ANCHOR_KEY_FILE from a secret).
if PRODUCTION:
    AUDIT_ANCHOR_KEY = env_required("SWITCHYARD_AUDIT_ANCHOR_KEY")
else:
    AUDIT_ANCHOR_KEY = env_str(
        "SWITCHYARD_AUDIT_ANCHOR_KEY", "embedded-demo-only-audit-anchor-" + "x" * 20
    )
AUDIT_ANCHOR_DIR = Path(env_str("SWITCHYARD_AUDIT_ANCHOR_DIR", str(RUN_DIR / "audit-anchors")))

# --- The signed audit export and record exports (governance/audit_export.py, docs/records.md)
# A base64 32-byte Ed25519 seed that signs audit-trail exports; auditors verify downloads with
# its public key. Production refuses to start without one; the embedded demo derives one.
if PRODUCTION:
    AUDIT_EXPORT_SIGNING_KEY = env_required("SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY")
else:
    AUDIT_EXPORT_SIGNING_KEY = env_str(
        "SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY",
        base64.b64encode(
            hashlib.sha256(b"switchyard-audit-export-demo:" + SECRET_KEY.encode()).digest()
        ).decode(),
    )
try:
    if len(base64.b64decode(AUDIT_EXPORT_SIGNING_KEY, validate=True)) != 32:
        raise ValueError
except ValueError:
    raise ConfigurationError(
        "SWITCHYARD_AUDIT_EXPORT_SIGNING_KEY must be 32 bytes, base64 (an Ed25519 seed)"
    ) from None
# The most records one export may hold; a larger selection is refused (400) before it starts.
RECORDS_EXPORT_MAX_RECORDS = env_int("SWITCHYARD_RECORDS_EXPORT_MAX_RECORDS", 1_000_000, minimum=1)

# --- The gateway's public address, shown in snippets and the portal -----------------------
GATEWAY_PUBLIC_URL = env_str("SWITCHYARD_GATEWAY_PUBLIC_URL", "http://127.0.0.1:8080")
# Where the portal's playground reaches the gateway from the web process (often an internal
# address), and how long one playground answer may take.
PLAYGROUND_GATEWAY_URL = env_str("SWITCHYARD_PLAYGROUND_GATEWAY_URL", GATEWAY_PUBLIC_URL)
PLAYGROUND_TIMEOUT_SECONDS = env_float("SWITCHYARD_PLAYGROUND_TIMEOUT_SECONDS", 60.0, minimum=1.0)

# --- Sessions and the browser's security policy --------------------------------------------
# A bounded session: after this a person signs in again (and SSO re-reads their roles).
SESSION_COOKIE_AGE = env_int("SWITCHYARD_SESSION_SECONDS", 8 * 3600, minimum=60)
# Scripts and styles from our own origin only: the templates hold no inline script or style
# (tests/config/test_production_settings.py checks them), so injected markup cannot run.
_FORM_TARGETS = ["'self'"] + (
    ["/".join(SSO_ISSUER.split("/")[:3])] if SSO_ISSUER else []
)  # the SSO sign-out form redirects to the IdP
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "connect-src": ["'self'"],  # the live fleet view's websocket is same-origin
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": _FORM_TARGETS,
    }
}

# Production hardening that would only get in the way of a loopback demo.
if PRODUCTION:
    SECURE_HSTS_SECONDS = env_int("SWITCHYARD_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SWITCHYARD_HSTS_INCLUDE_SUBDOMAINS", True)
    SESSION_COOKIE_SECURE = env_bool("SWITCHYARD_SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "kv": {"format": "ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "kv"}},
    "root": {"handlers": ["console"], "level": env_str("SWITCHYARD_LOG_LEVEL", "INFO")},
}
