"""Quicksave settings, read from environment variables (see .env.example)."""

from __future__ import annotations

import importlib.util
import os
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from csp.constants import NONE, SELF

from quicksave.env import ConfigError, check_strong_secret, envbool, envint, envlist, envsecret, envstr
from quicksave.keyring import new_master_key_entry, parse_keyring

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
    "memory",
    "integrations.langgraph.apps.LangGraphConfig",
    "integrations.pydantic_ai.apps.PydanticAIConfig",
    "integrations.adk.apps.AdkConfig",
    "integrations.openai_agents.apps.OpenAIAgentsConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "quicksave.middleware.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
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
        "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5, **pool, **query},
        "CONN_MAX_AGE": 0 if pool else envint("DATABASE_CONN_MAX_AGE", 60, minimum=0),
        "CONN_HEALTH_CHECKS": not pool,
        "TEST": {"NAME": envstr("DATABASE_TEST_NAME") or None},
    }


DATABASE_URL = envstr("DATABASE_URL")
EMBEDDED_DATABASE = not DATABASE_URL
if EMBEDDED_DATABASE:
    from quicksave.embedded import embedded_database_url

    DATABASE_URL = embedded_database_url(VAR_DIR)
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = envstr("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

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
    # Threads (and checkpoints) and approvals each have a `status` with its own choices.
    "ENUM_NAME_OVERRIDES": {
        "ThreadStatusEnum": "checkpoints.models.ThreadStatus",
        "ApprovalStatusEnum": "approvals.models.ApprovalStatus",
    },
}

# Checkpoint store.
QUICKSAVE_SNAPSHOT_EVERY = envint("QUICKSAVE_SNAPSHOT_EVERY", 1000, minimum=1)
QUICKSAVE_MAX_STATE_BYTES = envint("QUICKSAVE_MAX_STATE_BYTES", 16 * 1024 * 1024, minimum=1024)
QUICKSAVE_MAX_DEPTH = envint("QUICKSAVE_MAX_DEPTH", 64, minimum=2)
QUICKSAVE_MAX_METADATA_BYTES = envint("QUICKSAVE_MAX_METADATA_BYTES", 256 * 1024, minimum=1024)
QUICKSAVE_MAX_REQUEST_BYTES = envint("QUICKSAVE_MAX_REQUEST_BYTES", 32 * 1024 * 1024, minimum=1024)
QUICKSAVE_STATE_CACHE_BYTES = envint("QUICKSAVE_STATE_CACHE_BYTES", 128 * 1024 * 1024, minimum=0)
# `manage.py prune` compacts only threads idle this long (see checkpoints/retention.py).
QUICKSAVE_COMPACT_IDLE_HOURS = envint("QUICKSAVE_COMPACT_IDLE_HOURS", 24, minimum=0)
QUICKSAVE_INTEGRITY_KEY = envstr("QUICKSAVE_INTEGRITY_KEY") or SECRET_KEY
if QUICKSAVE_PRODUCTION and envstr("QUICKSAVE_INTEGRITY_KEY"):
    check_strong_secret("QUICKSAVE_INTEGRITY_KEY", QUICKSAVE_INTEGRITY_KEY)
QUICKSAVE_KEY_CACHE_SECONDS = envint("QUICKSAVE_KEY_CACHE_SECONDS", 5, minimum=0)
# Failed authentications (bad agent keys, failed sign-ins) one address may make in a minute before 429s.
QUICKSAVE_AUTH_FAILURES_PER_MINUTE = envint("QUICKSAVE_AUTH_FAILURES_PER_MINUTE", 20, minimum=1)
QUICKSAVE_MAX_QUERY_BYTES = envint("QUICKSAVE_MAX_QUERY_BYTES", 8192, minimum=1024)

# Long-term memory (memory/): the largest value one item may hold, as canonical JSON.
QUICKSAVE_MEMORY_MAX_VALUE_BYTES = envint("QUICKSAVE_MEMORY_MAX_VALUE_BYTES", 4 * 1024 * 1024, minimum=1024)

# Hot path (checkpoints/storage/hotcache.py): head states in Redis, when REDIS_URL is set.
QUICKSAVE_HOT_TTL_SECONDS = envint("QUICKSAVE_HOT_TTL_SECONDS", 3600, minimum=0)
QUICKSAVE_HOT_TIMEOUT_MS = envint("QUICKSAVE_HOT_TIMEOUT_MS", 250, minimum=1)
QUICKSAVE_HOT_RETRY_SECONDS = envint("QUICKSAVE_HOT_RETRY_SECONDS", 2, minimum=0)

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
QUICKSAVE_APPROVAL_EXPIRY_OUTCOME = envstr("QUICKSAVE_APPROVAL_EXPIRY_OUTCOME", "reject")
if QUICKSAVE_APPROVAL_EXPIRY_OUTCOME not in {"reject", "approve"}:
    raise ConfigError("QUICKSAVE_APPROVAL_EXPIRY_OUTCOME must be reject or approve")
DATA_UPLOAD_MAX_MEMORY_SIZE = QUICKSAVE_MAX_REQUEST_BYTES

TESTING = "pytest" in sys.modules or os.environ.get("QUICKSAVE_TESTING") == "1"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
}

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
