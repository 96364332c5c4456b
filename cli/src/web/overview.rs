//! The overview's numbers, shared by every viewer and every live update.
//!
//! Counting jobs per type and status is a scan of the job table: about 300 ms
//! on a million rows (`BENCHMARKS.md`, the web view). While that count is fast
//! (under [`SLOW`]), every request counts afresh, exactly as the database is.
//! Once it is slow, the last numbers are served at once and counted again in
//! the background at most once per refresh period, however many pages and
//! live streams are open; the page then says how old they are.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{App, WebError};
use crate::data::{self, OverviewView};

/// A count slower than this is served from the last result.
pub(super) const SLOW: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
pub(super) struct OverviewCache {
    last: Mutex<Option<Counted>>,
    refreshing: AtomicBool,
}

#[derive(Debug, Clone)]
struct Counted {
    view: OverviewView,
    at: Instant,
    took: Duration,
}

/// The overview, and how old it is (zero: counted for this request).
pub(super) struct Overview {
    pub(super) view: OverviewView,
    pub(super) age: Duration,
}

impl OverviewCache {
    /// The overview for a request on `app`.
    pub(super) async fn get(&self, app: &Arc<App>) -> Result<Overview, WebError> {
        let last = self.last.lock().await.clone();
        match last {
            Some(c) if c.took >= SLOW => {
                let age = c.at.elapsed();
                if age >= app.refresh {
                    self.refresh_in_background(app);
                }
                Ok(Overview { view: c.view, age })
            }
            _ => {
                let view = self.count(app).await?;
                Ok(Overview {
                    view,
                    age: Duration::ZERO,
                })
            }
        }
    }

    /// Counts now and keeps the result.
    async fn count(&self, app: &App) -> Result<OverviewView, WebError> {
        let started = Instant::now();
        let view = data::overview(&app.ctx, &app.store, &app.queue).await?;
        let counted = Counted {
            view: view.clone(),
            at: Instant::now(),
            took: started.elapsed(),
        };
        *self.last.lock().await = Some(counted);
        Ok(view)
    }

    fn refresh_in_background(&self, app: &Arc<App>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let app = app.clone();
        tokio::spawn(async move {
            if let Err(e) = app.overview.count(&app).await {
                let detail = tenure::security::redact_text(&e.to_string());
                tracing::warn!(error = %detail, "refreshing the overview failed");
            }
            app.overview.refreshing.store(false, Ordering::Release);
        });
    }
}
