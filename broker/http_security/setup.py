"""The HTTP services' security objects from the broker's settings (None where a service is open):
read once at start, so a bad users file or PEM file stops the broker with its key named."""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import SecretStr

from broker.config import REGISTRY_ROLE_PREFIX, BrokerConfig, ConfigError
from broker.http_security import oauth, tls, users
from broker.http_security.admin_auth import AdminAuth
from broker.http_security.registry_auth import RegistryAuth, RoleError
from broker.registry.store import SchemaStore


def registry_auth(config: BrokerConfig, store: SchemaStore) -> RegistryAuth | None:
    if config.registry_authentication_method != "BASIC":
        return None
    assert config.registry_users_file is not None  # the config model checks it
    try:
        return RegistryAuth(
            users.load_users(config.registry_users_file),
            config.registry_roles,
            REGISTRY_ROLE_PREFIX,
            store,
        )
    except (users.UsersFileError, RoleError) as exc:
        raise ConfigError(f"schema.registry.authentication.users.file: {exc}") from exc


def admin_auth(config: BrokerConfig) -> AdminAuth | None:
    if config.admin_authentication_method != "BASIC":
        return None
    assert config.admin_users_file is not None  # the config model checks it
    try:
        return AdminAuth(users.load_users(config.admin_users_file))
    except users.UsersFileError as exc:
        raise ConfigError(f"admin.authentication.users.file: {exc}") from exc


def catalog_auth(config: BrokerConfig) -> oauth.CatalogAuth | None:
    if config.catalog_authentication_method != "OAUTH2":
        return None
    assert config.catalog_clients_file is not None
    try:
        clients = users.load_users(config.catalog_clients_file)
    except users.UsersFileError as exc:
        raise ConfigError(f"catalog.oauth2.clients.file: {exc}") from exc
    configured = config.catalog_token_signing_key
    key = oauth.signing_key(configured.get_secret_value() if configured else None, config.home)
    return oauth.CatalogAuth(clients, key, config.catalog_token_lifetime_ms // 1000)


def registry_tls(config: BrokerConfig) -> ssl.SSLContext | None:
    if config.registry_ssl_keystore_location is None:
        return None
    return _context(
        config.registry_ssl_keystore_location,
        config.registry_ssl_key_password,
        "schema.registry.ssl.keystore.location",
    )


def catalog_tls(config: BrokerConfig) -> ssl.SSLContext | None:
    if config.catalog_ssl_keystore_location is None:
        return None
    return _context(
        config.catalog_ssl_keystore_location,
        config.catalog_ssl_key_password,
        "catalog.ssl.keystore.location",
    )


def _context(location: Path, password: SecretStr | None, key: str) -> ssl.SSLContext:
    try:
        return tls.server_context(location, password, key)
    except tls.TlsConfigError as exc:
        raise ConfigError(str(exc)) from exc
