"""Quicksave settings, read from environment variables (see .env.example)."""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from csp.constants import NONE, SELF

from quicksave.env import ConfigError, check_strong_secret, envbool, envint, envlist, envsecret, envstr
from quicksave.keyring import new_master_key_entry, parse_keyring
from quicksave.logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(envstr("QUICKSAVE_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = envbool("DEBUG", False)
# Production (QUICKSAVE_REQUIRE_SECRET_KEY) refuses to start without its secrets; the embedded
# default generates them once under var/, so sessions survive restarts and the demo runs encrypted.
QUICKSAVE_PRODUCTION = not DEBUG and envbool("QUICKSAVE_REQUIRE_SECRET_KEY", False)
SECRET_KEY = envsecret("SECRET_KEY", VAR_DIR / "secret_key", generate=lambda: secrets.token_urlsafe(50),
                       required=QUICKSAVE_PRODUCTION)  # fmt: skip
if QUICKSAVE_PRODUCTION:  # the integrity MACs and session signatures derive from it
    check_strong_secret("SECRET_KEY", SECRET_KEY)

ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "quicksave.apps.QuicksaveAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "quicksave",
    "quicksave_agents",
    "checkpoints",
    "approvals",
    "audit",
    "notifications",
    "memory",
    "integrations.langgraph.apps.LangGraphConfig",
    "integrations.pydantic_ai.apps.PydanticAIConfig",
    "integrations.adk.apps.AdkConfig",
    "integrations.openai_agents.apps.OpenAIAgentsConfig",
]

MIDDLEWARE = [
    "quicksave.middleware.RequestContextMiddleware",
    "quicksave.middleware.RequestMetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "quicksave.middleware.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "quicksave.people_views.PasswordToSetMiddleware",
    "quicksave.middleware.QueryStringLimitMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "quicksave.urls"
ASGI_APPLICATION = "quicksave.asgi.application"
WSGI_APPLICATION = "quicksave.wsgi.application"

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
                "quicksave.context_processors.dashboard",
            ],
        },
    },
]


# Behind a pooler in transaction mode (PgBouncer's pool_mode = transaction), consecutive
# transactions of one connection may run on different server connections: nothing may outlive a
# transaction on the server. So psycopg does not prepare statements (a name prepared on one server
# connection is unknown on the next) unless the pooler keeps them itself (PgBouncer >= 1.21 with
# max_prepared_statements: DATABASE_PREPARED_STATEMENTS=true), and Django's iterator() reads
# without the server-side cursors that outlive a transaction. LISTEN needs a session: the worker
# and the runs/claim long-poll listen on DATABASE_LISTEN_URL, a direct connection to PostgreSQL.
DATABASE_TRANSACTION_POOLING = envbool("DATABASE_TRANSACTION_POOLING", False)
DATABASE_PREPARED_STATEMENTS = envbool("DATABASE_PREPARED_STATEMENTS", not DATABASE_TRANSACTION_POOLING)


def database_from_url(url: str) -> dict[str, Any]:
    """Turn postgresql://user:pass@host:port/name?options into a Django DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql"}:
        raise ConfigError(f"DATABASE_URL must be a postgresql:// URL, got scheme {parsed.scheme!r}")
    query = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    host = query.pop("host", None) or parsed.hostname or ""
    name = unquote(parsed.path.lstrip("/"))
    pool_size = envint("DATABASE_POOL_SIZE", 10, minimum=0)
    pool: dict[str, Any] = {"pool": {"min_size": 1, "max_size": pool_size, "timeout": 10}} if pool_size else {}
    if not name:
        raise ConfigError("DATABASE_URL must name a database, e.g. postgresql://127.0.0.1/quicksave")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": host,
        "PORT": str(parsed.port or ""),
        # Server-side binding: the storage engine's statements (the append, the replay's reads)
        # run on Django's cursors, so its query log, debugging tools and tracing see them, and
        # psycopg prepares each on a connection once it has run `prepare_threshold` times.
        # Under ASGI each request runs in its own thread, so without a pool every request would
        # open a new connection (and prepare again); the pool hands it a warm one instead.
        # Unnamed server-side statements are safe in transaction pooling; prepared (named) ones
        # are only when the pooler tracks them (see DATABASE_TRANSACTION_POOLING above).
        "OPTIONS": {
            "server_side_binding": True,
            "prepare_threshold": 5 if DATABASE_PREPARED_STATEMENTS else None,
            **pool,
            **query,
        },
        "CONN_MAX_AGE": 0 if pool else envint("DATABASE_CONN_MAX_AGE", 60, minimum=0),
        "CONN_HEALTH_CHECKS": not pool,
        "DISABLE_SERVER_SIDE_CURSORS": DATABASE_TRANSACTION_POOLING,
        "TEST": {"NAME": envstr("DATABASE_TEST_NAME") or None},
    }


DATABASE_URL = envstr("DATABASE_URL")
EMBEDDED_DATABASE = not DATABASE_URL
if EMBEDDED_DATABASE:
    from quicksave.embedded import embedded_database_url

    DATABASE_URL = embedded_database_url(VAR_DIR)
DATABASES = {"default": database_from_url(DATABASE_URL)}
DATABASE_LISTEN_URL = envstr("DATABASE_LISTEN_URL")
if DATABASE_TRANSACTION_POOLING and not DATABASE_LISTEN_URL:
    raise ConfigError(
        "DATABASE_LISTEN_URL must be set with DATABASE_TRANSACTION_POOLING: LISTEN needs a direct connection to "
        "PostgreSQL (through a transaction pooler the worker would never be woken by NOTIFY)"
    )
# The connection that LISTENs for queued runs: DATABASE_LISTEN_URL, else DATABASE_URL's.
DATABASE_LISTEN = database_from_url(DATABASE_LISTEN_URL) if DATABASE_LISTEN_URL else DATABASES["default"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = envstr("REDIS_URL")
# Messages waiting for one server process (channels-redis keeps one list per process, all its
# sockets together, and drops what a group sends beyond it): channels-redis's default of 100 is
# a second of a busy server's events. Sockets replay what is dropped anyway (checkpoints.consumers).
QUICKSAVE_CHANNEL_CAPACITY = envint("QUICKSAVE_CHANNEL_CAPACITY", 10_000, minimum=100)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": QUICKSAVE_CHANNEL_CAPACITY},
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"capacity": QUICKSAVE_CHANNEL_CAPACITY},
        }
    }
# How often a thread's open sockets are checked against the thread's event counter, and inbox sockets
# against the pending approvals (one query each a server process): a thread socket whose last events were
# lost on the way replays them from the table, an inbox socket gets a fresh inbox.sync.
QUICKSAVE_LIVE_RECHECK_SECONDS: float = envint("QUICKSAVE_LIVE_RECHECK_SECONDS", 5, minimum=1)

# Large values moved out of checkpoints (checkpoints/storage/blobs.py): the filesystem under var/blobs,
# or any S3-compatible store through django-storages.
QUICKSAVE_OFFLOAD_BYTES = envint("QUICKSAVE_OFFLOAD_BYTES", 256 * 1024, minimum=1024)
QUICKSAVE_BLOB_STORAGE = envstr("QUICKSAVE_BLOB_STORAGE", "filesystem")
# `prune` spares blobs used (and files written) this recently: a write in flight may be about to refer to them.
QUICKSAVE_BLOB_GRACE_SECONDS = envint("QUICKSAVE_BLOB_GRACE_SECONDS", 3600, minimum=0)
if QUICKSAVE_BLOB_STORAGE == "filesystem":
    BLOB_STORAGE: dict[str, Any] = {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": envstr("QUICKSAVE_BLOB_DIR") or str(VAR_DIR / "blobs"), "allow_overwrite": True},
    }
elif QUICKSAVE_BLOB_STORAGE == "s3":
    BLOB_STORAGE = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": envstr("QUICKSAVE_S3_BUCKET") or None,
            "endpoint_url": envstr("QUICKSAVE_S3_ENDPOINT_URL") or None,
            "region_name": envstr("QUICKSAVE_S3_REGION") or None,
            "access_key": envstr("QUICKSAVE_S3_ACCESS_KEY_ID") or None,
            "secret_key": envstr("QUICKSAVE_S3_SECRET_ACCESS_KEY") or None,
            "location": envstr("QUICKSAVE_S3_PREFIX", "quicksave"),
            "file_overwrite": True,
            "default_acl": None,
        },
    }
    if not BLOB_STORAGE["OPTIONS"]["bucket_name"]:
        raise ConfigError("QUICKSAVE_S3_BUCKET must be set when QUICKSAVE_BLOB_STORAGE=s3")
else:
    raise ConfigError(f"QUICKSAVE_BLOB_STORAGE must be filesystem or s3, got {QUICKSAVE_BLOB_STORAGE!r}")

STORAGES = {
    "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(VAR_DIR / "media")},
    },
    "quicksave_blobs": BLOB_STORAGE,
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
QUICKSAVE_SERVE_STATIC = envbool("QUICKSAVE_SERVE_STATIC", True)
QUICKSAVE_HTTP_THREADS = envint("QUICKSAVE_HTTP_THREADS", 32, minimum=1)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "quicksave_agents.auth.AgentKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["quicksave.api.StrictJSONParser"],
    "EXCEPTION_HANDLER": "quicksave.api.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Quicksave API",
    "DESCRIPTION": "Versioned checkpoints, approvals and resumable runs for AI agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and docs are for signed-in people and agent keys (DRF's authentication classes).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Summaries from the operations' descriptions; the path parameters described (quicksave/api_docs.py).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "quicksave.api_docs.describe"],
    # Threads (and checkpoints) and approvals each have a `status` with its own choices.
    "ENUM_NAME_OVERRIDES": {
        "ThreadStatusEnum": "checkpoints.models.ThreadStatus",
        "ApprovalStatusEnum": "approvals.models.ApprovalStatus",
        # An approval's `risk` and a notification subscription's `risks` are one choice set; a
        # channel's `kind` is not an approval's (which keeps the name it had before channels came).
        "RiskEnum": "approvals.models.Risk",
        "KindEnum": "approvals.models.ApprovalKind",
        "ChannelKindEnum": "notifications.models.Kind",
        "NotificationEventEnum": "notifications.models.Notice",
        "DeliveryStatusEnum": "notifications.models.DeliveryStatus",
    },
}

# Checkpoint store.
QUICKSAVE_SNAPSHOT_EVERY = envint("QUICKSAVE_SNAPSHOT_EVERY", 1000, minimum=1)
QUICKSAVE_MAX_STATE_BYTES = envint("QUICKSAVE_MAX_STATE_BYTES", 16 * 1024 * 1024, minimum=1024)
QUICKSAVE_MAX_DEPTH = envint("QUICKSAVE_MAX_DEPTH", 64, minimum=2)
QUICKSAVE_MAX_METADATA_BYTES = envint("QUICKSAVE_MAX_METADATA_BYTES", 256 * 1024, minimum=1024)
QUICKSAVE_MAX_REQUEST_BYTES = envint("QUICKSAVE_MAX_REQUEST_BYTES", 32 * 1024 * 1024, minimum=1024)
# Each process's cache of materialised states (checkpoints/storage/nodes.py), counted as the states'
# canonical JSON plus 1 KiB a state. An append's state takes its parent's place there, so writes keep one
# state a thread (its head) and the rest is what readers read; 32 MiB holds the heads of thousands of
# active threads. (When every append added a state, a 20-minute soak of bench/load.py was still filling
# it at 128 MiB: +67 MiB a server process.)
QUICKSAVE_STATE_CACHE_BYTES = envint("QUICKSAVE_STATE_CACHE_BYTES", 32 * 1024 * 1024, minimum=0)
# `manage.py prune` compacts only threads idle this long (see checkpoints/compaction.py).
QUICKSAVE_COMPACT_IDLE_HOURS = envint("QUICKSAVE_COMPACT_IDLE_HOURS", 24, minimum=0)
QUICKSAVE_INTEGRITY_KEY = envstr("QUICKSAVE_INTEGRITY_KEY") or SECRET_KEY
if QUICKSAVE_PRODUCTION and envstr("QUICKSAVE_INTEGRITY_KEY"):
    check_strong_secret("QUICKSAVE_INTEGRITY_KEY", QUICKSAVE_INTEGRITY_KEY)
QUICKSAVE_KEY_CACHE_SECONDS = envint("QUICKSAVE_KEY_CACHE_SECONDS", 5, minimum=0)
# Failed authentications (bad agent keys, failed sign-ins) one address may make in a minute before 429s.
QUICKSAVE_AUTH_FAILURES_PER_MINUTE = envint("QUICKSAVE_AUTH_FAILURES_PER_MINUTE", 20, minimum=1)
QUICKSAVE_MAX_QUERY_BYTES = envint("QUICKSAVE_MAX_QUERY_BYTES", 8192, minimum=1024)

# The GenAI export (checkpoints/genai.py): the agents whose threads are sent live as OpenTelemetry GenAI
# spans (names, comma-separated; none by default), where to (an OTLP/HTTP traces URL; unset: where the
# OTEL_EXPORTER_OTLP_* variables say), and whether message content goes with them (off by default).
QUICKSAVE_GENAI_LIVE_AGENTS = frozenset(envlist("QUICKSAVE_GENAI_LIVE_AGENTS"))
for _name in QUICKSAVE_GENAI_LIVE_AGENTS:
    if not re.fullmatch(r"[-a-zA-Z0-9_]{1,64}", _name):
        raise ConfigError(
            f"QUICKSAVE_GENAI_LIVE_AGENTS must list agent names (letters, digits, - and _), got {_name!r}"
        )
QUICKSAVE_GENAI_OTLP_ENDPOINT = envstr("QUICKSAVE_GENAI_OTLP_ENDPOINT").strip()
if QUICKSAVE_GENAI_OTLP_ENDPOINT and urlparse(QUICKSAVE_GENAI_OTLP_ENDPOINT).scheme not in ("http", "https"):
    raise ConfigError(
        f"QUICKSAVE_GENAI_OTLP_ENDPOINT must be an http:// or https:// URL, got {QUICKSAVE_GENAI_OTLP_ENDPOINT!r}"
    )
QUICKSAVE_GENAI_CAPTURE_CONTENT = envbool("QUICKSAVE_GENAI_CAPTURE_CONTENT", False)

# Long-term memory (memory/): the largest value one item may hold, as canonical JSON.
QUICKSAVE_MEMORY_MAX_VALUE_BYTES = envint("QUICKSAVE_MEMORY_MAX_VALUE_BYTES", 4 * 1024 * 1024, minimum=1024)

# Encryption at rest (checkpoints/storage/crypto.py): master keys that wrap each thread's data key.
QUICKSAVE_ENCRYPT = envbool("QUICKSAVE_ENCRYPT", True)
QUICKSAVE_ENCRYPTION_KEYS = envsecret(
    "QUICKSAVE_ENCRYPTION_KEYS",
    VAR_DIR / "encryption_keys",
    generate=lambda: new_master_key_entry("local-1"),
    required=QUICKSAVE_PRODUCTION,
)
parse_keyring(QUICKSAVE_ENCRYPTION_KEYS)  # a bad keyring stops the process here, naming the entry

# Approvals, runs and in-process agents.


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing (google, for google.adk)
        return False


# The framework demo agents join the default when their optional requirements are installed.
QUICKSAVE_AGENT_MODULES = envlist(
    "QUICKSAVE_AGENT_MODULES",
    ["quicksave_agents.demo"]
    + (["integrations.pydantic_ai.demo"] if _installed("pydantic_ai") else [])
    + (["integrations.adk.demo"] if _installed("google.adk") else [])
    # `agents` is the OpenAI Agents SDK's package.
    + (["integrations.openai_agents.demo"] if _installed("agents") else []),
)
QUICKSAVE_EMBEDDED_WORKER = envbool("QUICKSAVE_EMBEDDED_WORKER", EMBEDDED_DATABASE)
QUICKSAVE_RUN_LEASE_SECONDS = envint("QUICKSAVE_RUN_LEASE_SECONDS", 30, minimum=1)
# A queued run no worker has claimed for this long is shown as a warning naming its agent.
QUICKSAVE_UNCLAIMED_RUN_SECONDS = envint("QUICKSAVE_UNCLAIMED_RUN_SECONDS", 30, minimum=1)
QUICKSAVE_APPROVAL_EXPIRY_OUTCOME = envstr("QUICKSAVE_APPROVAL_EXPIRY_OUTCOME", "reject")
if QUICKSAVE_APPROVAL_EXPIRY_OUTCOME not in {"reject", "approve"}:
    raise ConfigError("QUICKSAVE_APPROVAL_EXPIRY_OUTCOME must be reject or approve")
DATA_UPLOAD_MAX_MEMORY_SIZE = QUICKSAVE_MAX_REQUEST_BYTES

# Notifications (notifications/): the dashboard's address as links in messages point to it, how
# deliveries are retried, and email.
QUICKSAVE_PUBLIC_URL = envstr("QUICKSAVE_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
if urlparse(QUICKSAVE_PUBLIC_URL).scheme not in {"http", "https"} or not urlparse(QUICKSAVE_PUBLIC_URL).netloc:
    raise ConfigError(f"QUICKSAVE_PUBLIC_URL must be an http:// or https:// URL, got {QUICKSAVE_PUBLIC_URL!r}")
QUICKSAVE_NOTIFY_RETRY_SECONDS: float = envint("QUICKSAVE_NOTIFY_RETRY_SECONDS", 10, minimum=1)
QUICKSAVE_NOTIFY_MAX_ATTEMPTS = envint("QUICKSAVE_NOTIFY_MAX_ATTEMPTS", 8, minimum=1)
QUICKSAVE_NOTIFY_TIMEOUT_SECONDS = envint("QUICKSAVE_NOTIFY_TIMEOUT_SECONDS", 10, minimum=1)
QUICKSAVE_NOTIFY_CONCURRENCY = envint("QUICKSAVE_NOTIFY_CONCURRENCY", 4, minimum=1)
QUICKSAVE_NOTIFY_EXPIRING_SECONDS = envint("QUICKSAVE_NOTIFY_EXPIRING_SECONDS", 900, minimum=0)
QUICKSAVE_NOTIFY_KEEP_DAYS = envint("QUICKSAVE_NOTIFY_KEEP_DAYS", 30, minimum=1)
QUICKSAVE_DECISION_LINK_SECONDS = envint("QUICKSAVE_DECISION_LINK_SECONDS", 24 * 3600, minimum=60)
# Email goes to the console (the server's log) until EMAIL_HOST names an SMTP server.
EMAIL_HOST = envstr("EMAIL_HOST")
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST else "django.core.mail.backends.console.EmailBackend"
)
EMAIL_PORT = envint("EMAIL_PORT", 587, minimum=1)
EMAIL_HOST_USER = envstr("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = envstr("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", True)
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ConfigError("EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be on; SSL on port 465 wants EMAIL_USE_TLS=false")
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = envstr("DEFAULT_FROM_EMAIL", "Quicksave <quicksave@localhost>")

TESTING = "pytest" in sys.modules or os.environ.get("QUICKSAVE_TESTING") == "1"

# Log lines (quicksave/logs.py): JSON objects in production, plain text otherwise, each naming its
# request and thread.
QUICKSAVE_LOG_FORMAT = envstr("QUICKSAVE_LOG_FORMAT", "json" if QUICKSAVE_PRODUCTION else "text")
if QUICKSAVE_LOG_FORMAT not in {"json", "text"}:
    raise ConfigError(f"QUICKSAVE_LOG_FORMAT must be json or text, got {QUICKSAVE_LOG_FORMAT!r}")
# QUICKSAVE_LOG_FILE (set by `dev.py run`): every line to that file, only Quicksave's own to the console.
LOGGING = logging_config(json_lines=QUICKSAVE_LOG_FORMAT == "json", level=envstr("LOG_LEVEL", "INFO"),
                         log_file=envstr("QUICKSAVE_LOG_FILE"))  # fmt: skip

# Metrics (quicksave/metrics.py, quicksave/scrape.py): GET /metrics with this bearer token; unset,
# /metrics answers 404. run_agents --metrics-port serves a worker's own on an internal address.
QUICKSAVE_METRICS_TOKEN = envstr("QUICKSAVE_METRICS_TOKEN")
if QUICKSAVE_PRODUCTION and QUICKSAVE_METRICS_TOKEN and len(QUICKSAVE_METRICS_TOKEN) < 32:
    raise ConfigError("QUICKSAVE_METRICS_TOKEN must be at least 32 characters long in production")

# Every response forbids inline scripts and styles and anything from another origin: templates
# keep their styles in static/css and their scripts in static/js (see ContentSecurityPolicyMiddleware).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "connect-src": [SELF],  # and ws:// and wss:// of the request's host
        "frame-ancestors": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "object-src": [NONE],
    }
}

# Security headers and cookies. The HTTPS-only ones are off by default so the embedded default
# works over plain http://127.0.0.1; production turns them on (`manage.py check --deploy` is clean then).
if not DEBUG:
    SESSION_COOKIE_HTTPONLY = True
    SESSION_COOKIE_SAMESITE = "Lax"
    CSRF_COOKIE_SAMESITE = "Lax"
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SECURE_REFERRER_POLICY = "same-origin"
    SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
    X_FRAME_OPTIONS = "DENY"
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", False)
    SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", False)
    CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", False)
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 0, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", False)
    if envbool("SECURE_PROXY_SSL_HEADER", False):
        # Only behind a proxy that sets X-Forwarded-Proto itself and strips it from clients.
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
