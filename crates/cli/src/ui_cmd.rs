//! `roar ui`: the lineage graph as a web page (`roar_ui`), served on 127.0.0.1 over the project's
//! store. The API answers with the JSON of the matching command: `/api/dag` = `roar dag --json`,
//! `/api/job/ID` = `roar show ID --json`, `/api/status` = `roar status --json`, `/api/diff?a=&b=`
//! = `roar diff A B --json`, `/api/runs?job=ID` = `roar runs` of that job's name.

use roar_store::{Project, Store};
use roar_ui::{Answers, ApiError, Params, Server};

pub fn serve(port: u16, json: bool) -> anyhow::Result<()> {
    let project = crate::project()?;
    // Fails here, with the store's own message, rather than on the first request.
    drop(open(&project)?);
    let root = project.root.to_string_lossy().into_owned();
    let server = Server::bind(
        port,
        &roar_ui::page::Config {
            mode: "server",
            root: &root,
            collapse_at: crate::graph::COLLAPSE_AT,
            generated_ns: None,
        },
    )?;
    let url = server.url();
    // Whoever started us may stop reading our output (a pipe closed): the server goes on.
    let said = if json {
        serde_json::to_string(&serde_json::json!({ "url": url, "port": server.port() }))
    } else {
        Ok(format!("roar ui: open {url}\n(127.0.0.1 only; the token keeps other local users out; Ctrl-C stops)"))
    }?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{said}").and_then(|()| out.flush());
    }
    let watched = Store::open(&project.db_path())?;
    server.run(StoreAnswers(project), move || watched.revision().ok())?;
    Ok(())
}

fn open(project: &Project) -> anyhow::Result<Store> {
    let mut store = Store::open(&project.db_path())?;
    let config = crate::config::Config::load(project)?;
    store.hide(Some(roar_store::ignore::Ignore::new(&config.ignore)))?;
    Ok(store)
}

/// The project's store answering the page, each request from a store opened for it.
struct StoreAnswers(Project);

impl Answers for StoreAnswers {
    fn answer(&self, path: &str, params: &Params) -> Result<Vec<u8>, ApiError> {
        answer(&self.0, path, params).map_err(|e| match e.downcast::<ApiError>() {
            Ok(e) => e,
            Err(e) => match crate::exit_code(&e) {
                crate::exit::NOT_FOUND => ApiError::NotFound(format!("{e:#}")),
                crate::exit::AMBIGUOUS => ApiError::BadRequest(format!("{e:#}")),
                _ => ApiError::Internal(format!("{e:#}")),
            },
        })
    }
}

/// The JSON of the command each API path stands for.
fn answer(project: &Project, path: &str, params: &Params) -> anyhow::Result<Vec<u8>> {
    let store = open(project)?;
    let json = match path {
        "/api/dag" => json(&crate::graph::project_dag(&store)?),
        "/api/status" => json(&crate::status_cmd::report(project, &store)?),
        "/api/diff" => {
            let arg = |n: &str| {
                params.get(n).ok_or_else(|| {
                    ApiError::BadRequest(format!("/api/diff needs ?a=JOB&b=JOB ({n} is missing)"))
                })
            };
            let (a, b) = (arg("a")?, arg("b")?);
            json(&crate::diff_cmd::compare_in(
                &store,
                a.as_ref(),
                b.as_ref(),
            )?)
        }
        "/api/runs" => {
            let job = params
                .get("job")
                .and_then(|j| j.parse::<i64>().ok())
                .ok_or_else(|| ApiError::BadRequest("/api/runs needs ?job=JOB".into()))?;
            let runs = crate::runs_cmd::runs_of_job(&store, Some(&project.objects()), job)?;
            let (name, runs) = runs.unwrap_or_default();
            json(&serde_json::json!({ "name": name, "runs": runs }))
        }
        _ => match path.strip_prefix("/api/job/").map(str::parse::<i64>) {
            Some(Ok(id)) => json(&store.job(id)?),
            _ => return Err(ApiError::NotFound(format!("no API at {path}")).into()),
        },
    };
    Ok(json)
}

/// JSON as every output writes it (`roar_store::quote::write_json`).
fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    roar_store::quote::json_string(value).into_bytes()
}
