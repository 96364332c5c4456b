//! The secured dev stack (`DevStackOptions { tls: true, auth: true }`): a
//! throwaway CA and certificates made at start (rcgen), and the users, roles
//! and permissions of each server.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    date_time_ymd,
};

use super::DevStackError;
use crate::blocks::queue::{NatsPermissions, NatsRole};
use crate::security::{NatsAuth, Secret, TlsFiles};

/// The certificates of a secured dev stack, as PEM files in its directory.
#[derive(Debug, Clone)]
pub struct DevTls {
    /// The stack's CA (signs every certificate below).
    pub ca_file: PathBuf,
    /// Server certificate and key (`localhost`, `127.0.0.1`), used by all three servers.
    pub server_cert: PathBuf,
    /// The server certificate's key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA (mutual TLS).
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// A client certificate signed by the CA that expired in 2020.
    pub expired_client_cert: PathBuf,
    /// Its key.
    pub expired_client_key: PathBuf,
    /// Another CA, which signed nothing the servers use (a "wrong CA").
    pub other_ca_file: PathBuf,
}

impl DevTls {
    /// TLS settings trusting the stack's CA, with the valid client certificate.
    pub fn client(&self) -> TlsFiles {
        TlsFiles::new(&self.ca_file).with_client_cert(&self.client_cert, &self.client_key)
    }
}

/// A NATS user of a secured dev stack: a role of one namespace.
#[derive(Debug, Clone)]
pub struct DevNatsUser {
    /// The namespace it belongs to.
    pub namespace: String,
    /// What it may do there ([`NatsPermissions::for_role`]).
    pub role: NatsRole,
    /// Its user name.
    pub user: String,
    /// Its password.
    pub password: Secret,
}

impl DevNatsUser {
    /// Its credentials for [`Config::with_nats_auth`](crate::Config::with_nats_auth).
    pub fn auth(&self) -> NatsAuth {
        NatsAuth::UserPassword {
            user: self.user.clone(),
            password: self.password.clone(),
        }
    }
}

/// The NATS users of one namespace of a secured dev stack, one per role.
#[derive(Debug, Clone)]
pub struct DevNatsRoles {
    /// Provisions the streams, reads and redrives the DLQ, cancels.
    pub operator: DevNatsUser,
    /// Enqueues, waits for results, sends cancel notices.
    pub producer: DevNatsUser,
    /// Runs jobs.
    pub worker: DevNatsUser,
}

impl DevNatsRoles {
    fn new(namespace: &str, user_prefix: &str, pw: &impl Fn() -> Secret) -> Self {
        let user = |role: NatsRole, name: String| DevNatsUser {
            namespace: namespace.to_string(),
            role,
            user: name,
            password: pw(),
        };
        DevNatsRoles {
            operator: user(NatsRole::Operator, format!("{user_prefix}_operator")),
            producer: user(NatsRole::Producer, format!("{user_prefix}_producer")),
            worker: user(
                NatsRole::Worker,
                match user_prefix {
                    // The first namespace's worker keeps its old name.
                    "tenure" => "tenure".into(),
                    p => format!("{p}_worker"),
                },
            ),
        }
    }

    /// The user of `role`.
    pub fn get(&self, role: NatsRole) -> &DevNatsUser {
        match role {
            NatsRole::Operator => &self.operator,
            NatsRole::Producer => &self.producer,
            NatsRole::Worker => &self.worker,
        }
    }

    fn all(&self) -> [&DevNatsUser; 3] {
        [&self.operator, &self.producer, &self.worker]
    }
}

/// A NATS user of a secured dev stack beyond the roles of its namespaces: a
/// party of the application's own (a service its steps call, or a caller of
/// one), with permissions of its own. Its password is made at start
/// ([`DevAuth::extra_nats_auth`]).
#[derive(Debug, Clone)]
pub struct ExtraNatsUser {
    /// Its user name.
    pub user: String,
    /// What it may do.
    pub permissions: NatsPermissions,
}

/// The users and passwords of a secured dev stack (`auth: true`).
#[derive(Debug, Clone)]
pub struct DevAuth {
    /// The namespace the limited users may use (etcd prefix `<ns>/`, NATS subjects).
    pub namespace: String,
    /// A second namespace with NATS users of its own, for the tests that one
    /// namespace cannot reach another: `<namespace>_dlq`, so its stream names
    /// (`TENURE_<NS>_DLQ_JOBS`, ...) begin with the first namespace's DLQ
    /// stream name and a rule that is not exact shows.
    pub other_namespace: String,
    /// etcd `root` password.
    pub etcd_root_password: Secret,
    /// etcd user limited to the namespace's prefix: `tenure`.
    pub etcd_user: String,
    /// Its password.
    pub etcd_password: Secret,
    /// NATS `admin` password (every permission; the stack's own readiness probe).
    pub nats_admin_password: Secret,
    /// The NATS users of [`DevAuth::namespace`]: `tenure_operator`,
    /// `tenure_producer`, `tenure` (the worker).
    pub nats: DevNatsRoles,
    /// The NATS users of [`DevAuth::other_namespace`]: `other_operator`,
    /// `other_producer`, `other_worker`.
    pub other_nats: DevNatsRoles,
    /// PostgreSQL superuser (`postgres`) password.
    pub postgres_password: Secret,
    /// PostgreSQL migrator role (owns Tenure's schema): `tenure_migrator`.
    pub migrator_password: Secret,
    /// PostgreSQL worker role (DML on job rows only): `tenure_worker`.
    pub worker_password: Secret,
    /// `DevStackOptions::extra_nats_users`, with their passwords.
    extra_nats: Vec<(ExtraNatsUser, Secret)>,
}

impl DevAuth {
    pub(crate) fn new(namespace: &str, extra_nats_users: &[ExtraNatsUser]) -> Self {
        let pw = || Secret::new(format!("pw-{:016x}", rand::random::<u64>()));
        let other_namespace = format!("{namespace}_dlq");
        DevAuth {
            namespace: namespace.to_string(),
            nats: DevNatsRoles::new(namespace, "tenure", &pw),
            other_nats: DevNatsRoles::new(&other_namespace, "other", &pw),
            other_namespace,
            nats_admin_password: pw(),
            etcd_root_password: pw(),
            etcd_user: "tenure".into(),
            etcd_password: pw(),
            postgres_password: pw(),
            migrator_password: pw(),
            worker_password: pw(),
            extra_nats: extra_nats_users.iter().map(|u| (u.clone(), pw())).collect(),
        }
    }

    /// The credentials of extra NATS user `user`
    /// (`DevStackOptions::extra_nats_users`), if the stack has one of that name.
    pub fn extra_nats_auth(&self, user: &str) -> Option<NatsAuth> {
        self.extra_nats
            .iter()
            .find(|(u, _)| u.user == user)
            .map(|(u, password)| NatsAuth::UserPassword {
                user: u.user.clone(),
                password: password.clone(),
            })
    }

    /// NATS credentials of the namespace's worker (`tenure`).
    pub fn nats_auth(&self) -> NatsAuth {
        self.nats.worker.auth()
    }

    /// Every limited NATS user, of both namespaces.
    pub fn nats_users(&self) -> impl Iterator<Item = &DevNatsUser> {
        self.nats.all().into_iter().chain(self.other_nats.all())
    }
}

fn cert_error(what: &str, e: rcgen::Error) -> DevStackError {
    DevStackError::io(what, std::io::Error::other(e))
}

fn ca(name: &str) -> Result<(KeyPair, CertificateParams), DevStackError> {
    let key = KeyPair::generate().map_err(|e| cert_error("generate CA key", e))?;
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| cert_error("CA params", e))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    Ok((key, params))
}

/// Writes a leaf certificate signed by `issuer` and its key; `expired` makes one
/// valid only in 2019.
fn leaf(
    dir: &Path,
    name: &str,
    issuer: &Issuer<'_, KeyPair>,
    server: bool,
    expired: bool,
) -> Result<(PathBuf, PathBuf), DevStackError> {
    let key = KeyPair::generate().map_err(|e| cert_error("generate key", e))?;
    let sans = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let mut params = CertificateParams::new(sans).map_err(|e| cert_error("cert params", e))?;
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = if server {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    if expired {
        params.not_before = date_time_ymd(2019, 1, 1);
        params.not_after = date_time_ymd(2020, 1, 1);
    }
    let cert = params
        .signed_by(&key, issuer)
        .map_err(|e| cert_error("sign cert", e))?;
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    write(&cert_path, &cert.pem())?;
    super::write_private(&key_path, key.serialize_pem().as_bytes())?;
    Ok((cert_path, key_path))
}

fn write(path: &Path, text: &str) -> Result<(), DevStackError> {
    std::fs::write(path, text)
        .map_err(|e| DevStackError::io(format!("write {}", path.display()), e))
}

/// Makes the CA and certificates in `dir/tls`.
pub(crate) fn make_tls(dir: &Path) -> Result<DevTls, DevStackError> {
    let dir = dir.join("tls");
    std::fs::create_dir_all(&dir).map_err(|e| DevStackError::io("create tls dir", e))?;
    let (ca_key, ca_params) = ca("tenure dev CA")?;
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .map_err(|e| cert_error("self-sign CA", e))?;
    let ca_file = dir.join("ca.pem");
    write(&ca_file, &ca_cert.pem())?;
    let issuer = Issuer::new(ca_params, ca_key);
    let (server_cert, server_key) = leaf(&dir, "server", &issuer, true, false)?;
    let (client_cert, client_key) = leaf(&dir, "client", &issuer, false, false)?;
    let (expired_client_cert, expired_client_key) =
        leaf(&dir, "expired-client", &issuer, false, true)?;
    let (other_key, other_params) = ca("another CA")?;
    let other = other_params
        .self_signed(&other_key)
        .map_err(|e| cert_error("self-sign other CA", e))?;
    let other_ca_file = dir.join("other-ca.pem");
    write(&other_ca_file, &other.pem())?;
    Ok(DevTls {
        ca_file,
        server_cert,
        server_key,
        client_cert,
        client_key,
        expired_client_cert,
        expired_client_key,
        other_ca_file,
    })
}

/// The NATS server configuration: TLS with client certificates, and the users.
pub(crate) fn nats_conf(tls: Option<&DevTls>, auth: Option<&DevAuth>) -> String {
    let mut conf = String::new();
    if let Some(t) = tls {
        conf += &format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 2\n}}\n",
            t.server_cert.display(),
            t.server_key.display(),
            t.ca_file.display()
        );
    }
    if let Some(a) = auth {
        let mut users = format!(
            "    {{ user: \"admin\", password: \"{}\" }}\n",
            a.nats_admin_password.expose()
        );
        for u in a.nats_users() {
            users += &format!(
                "    {{ user: \"{}\", password: \"{}\", permissions: {} }}\n",
                u.user,
                u.password.expose(),
                NatsPermissions::for_role(&u.namespace, u.role).to_conf(),
            );
        }
        for (u, password) in &a.extra_nats {
            users += &format!(
                "    {{ user: \"{}\", password: \"{}\", permissions: {} }}\n",
                u.user,
                password.expose(),
                u.permissions.to_conf(),
            );
        }
        conf += &format!("authorization {{\n  users = [\n{users}  ]\n}}\n");
    }
    conf
}

/// etcd: `root` (role root) and `tenure` (role `tenure`: read-write on the
/// namespace's prefix only), then `auth enable`.
pub(crate) async fn etcd_enable_auth(
    endpoints: &[String],
    options: etcd_client::ConnectOptions,
    auth: &DevAuth,
) -> Result<(), DevStackError> {
    let fail =
        |what: &str, e: etcd_client::Error| DevStackError::io(what, std::io::Error::other(e));
    let client = etcd_client::Client::connect(endpoints, Some(options))
        .await
        .map_err(|e| fail("connect to etcd", e))?;
    let mut a = client.auth_client();
    a.user_add("root", auth.etcd_root_password.expose(), None)
        .await
        .map_err(|e| fail("etcd user add root", e))?;
    a.user_grant_role("root", "root")
        .await
        .map_err(|e| fail("etcd grant root", e))?;
    a.role_add("tenure")
        .await
        .map_err(|e| fail("etcd role add", e))?;
    let prefix = format!("{}/", auth.namespace);
    let perm = etcd_client::Permission::read_write(prefix).with_prefix();
    a.role_grant_permission("tenure", perm)
        .await
        .map_err(|e| fail("etcd role grant-permission", e))?;
    a.user_add(auth.etcd_user.clone(), auth.etcd_password.expose(), None)
        .await
        .map_err(|e| fail("etcd user add tenure", e))?;
    a.user_grant_role(auth.etcd_user.clone(), "tenure")
        .await
        .map_err(|e| fail("etcd grant tenure", e))?;
    a.auth_enable()
        .await
        .map_err(|e| fail("etcd auth enable", e))?;
    Ok(())
}

/// pg_hba.conf of a secured PostgreSQL: TLS only (`hostssl`), a client
/// certificate signed by the CA (with `tls`), SCRAM passwords (with `auth`);
/// everything else, plaintext included, is refused.
pub(crate) fn pg_hba(tls: bool, auth: bool) -> String {
    let host = if tls { "hostssl" } else { "host" };
    let method = if auth { "scram-sha-256" } else { "trust" };
    let cert = if tls { " clientcert=verify-ca" } else { "" };
    format!("local all all trust\n{host} all all 127.0.0.1/32 {method}{cert}\n")
}

/// The roles of the least-privilege setup (see `guide::production`): run as the
/// superuser on database `db`.
pub(crate) fn pg_roles_sql(auth: &DevAuth, db: &str) -> Vec<String> {
    vec![
        format!(
            "CREATE ROLE tenure_migrator LOGIN PASSWORD '{}'",
            auth.migrator_password.expose()
        ),
        format!(
            "CREATE ROLE tenure_worker LOGIN PASSWORD '{}'",
            auth.worker_password.expose()
        ),
        "CREATE ROLE tenure_admin NOLOGIN".into(),
        format!("GRANT CONNECT, CREATE ON DATABASE {db} TO tenure_migrator"),
        format!("GRANT CONNECT ON DATABASE {db} TO tenure_worker"),
    ]
}
