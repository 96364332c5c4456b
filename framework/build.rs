// Rebuild when the embedded migrations change (`sqlx::migrate!` in `fence`).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
