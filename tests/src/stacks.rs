//! The dev stacks of the test binaries that `#[tenure::test]` cannot give
//! (its environment runs on the default shared stack, or one of its own):
//! one stack per test binary and set of servers, started on first use.

use tenure::Config;
use tenure::devstack::{DevStack, DevStackOptions};
use tenure::security::{NatsAuth, Secret};

/// PostgreSQL alone (`mariadb`: and MariaDB), no etcd or NATS: for the fence
/// tests, each of which takes its own schema (or MariaDB database).
pub fn database_stack(mariadb: bool) -> &'static DevStack {
    DevStack::shared_with(DevStackOptions {
        etcd: false,
        nats: false,
        mariadb,
        ..DevStackOptions::default()
    })
    .expect("database dev stack")
}

/// Every server with TLS and limited users (`mariadb`: MariaDB too), whose
/// etcd and NATS users may act in `namespace` only: for the security tests.
pub fn secured_stack(namespace: &str, mariadb: bool) -> &'static DevStack {
    DevStack::shared_with(DevStackOptions {
        tls: true,
        auth: true,
        mariadb,
        namespace: namespace.into(),
        ..DevStackOptions::default()
    })
    .expect("secured dev stack")
}

/// A config of namespace `namespace` on a [`secured_stack`]: TLS to etcd and
/// NATS, the stack's etcd user, NATS as `nats`, PostgreSQL as `role` with
/// `password` (database `tenure`).
pub fn secured_config(
    stack: &DevStack,
    namespace: &str,
    nats: NatsAuth,
    role: &str,
    password: &Secret,
) -> Config {
    let (tls, auth) = (stack.tls().expect("tls"), stack.auth().expect("auth"));
    Config::new(namespace)
        .with_etcd_endpoints(stack.etcd_endpoints())
        .with_etcd_tls(tls.client())
        .with_etcd_user(&auth.etcd_user, auth.etcd_password.clone())
        .with_nats_url(stack.nats_url())
        .with_nats_tls(tls.client())
        .with_nats_auth(nats)
        .with_database_url(stack.database_url_as(role, Some(password), "tenure"))
}
