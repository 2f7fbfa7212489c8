//! Which definitions rover reads, and which it refuses, by key and by variable.

use super::*;

fn parse(text: &str) -> Result<DevcontainerConfig, String> {
    parse_devcontainer(text, &LocalEnv::default())
}

fn home_allowed() -> LocalEnv {
    LocalEnv::new([("HOME".to_owned(), Some("home/rover".to_owned()))])
}

fn refusal(text: &str) -> String {
    parse(text).expect_err(text)
}

#[test]
fn comments_and_trailing_commas_are_dropped_but_not_inside_strings() {
    let text = "// top\n{\n  \"a\": \"http://x/*y*/\", /* c */\n  \"b\": [1, 2,],\n}\n";
    let value: Value = serde_json::from_str(&strip_jsonc(text)).expect("plain JSON");
    assert_eq!(value["a"], "http://x/*y*/");
    assert_eq!(value["b"], serde_json::json!([1, 2]));
}

#[test]
fn reads_the_build_and_notes_what_rover_does_not_apply() {
    let config = parse(
        r#"{ "build": { "dockerfile": "Dockerfile", "context": ".." },
             "postCreateCommand": "pip install -r requirements.txt",
             "postStartCommand": "echo hi", "forwardPorts": [8000] }"#,
    )
    .expect("supported");
    let dockerfile = config.dockerfile.expect("a Dockerfile");
    assert_eq!(
        (dockerfile.key.as_str(), dockerfile.path.as_str()),
        ("build.dockerfile", "Dockerfile")
    );
    assert_eq!(config.context.map(|c| c.path).as_deref(), Some(".."));
    assert_eq!(config.paths.len(), 2);
    assert_eq!(config.notes.len(), 2, "{:?}", config.notes);
    assert!(config
        .notes
        .iter()
        .any(|n| n.starts_with("`postStartCommand`")));
    let legacy = parse(r#"{"dockerFile": "D"}"#).expect("older key");
    assert_eq!(legacy.dockerfile.map(|d| d.path).as_deref(), Some("D"));
}

#[test]
fn every_key_of_the_allow_list_is_accepted() {
    let text = r#"{"$schema": "s", "name": "n", "image": "debian", "containerEnv": {"A": "1"},
        "remoteEnv": {"B": "${containerEnv:PATH}:/x"}, "remoteUser": "u", "containerUser": "u",
        "updateRemoteUserUID": false, "userEnvProbe": "none", "onCreateCommand": "a",
        "updateContentCommand": ["b"], "postCreateCommand": {"x": "c"}, "postStartCommand": "d",
        "postAttachCommand": "e", "waitFor": "onCreateCommand", "customizations": {"vscode": {}},
        "extensions": [], "settings": {}, "devPort": 1, "forwardPorts": [3000],
        "portsAttributes": {"3000": {"label": "app"}}, "otherPortsAttributes": {},
        "workspaceFolder": "/w", "overrideCommand": true, "shutdownAction": "none",
        "features": {}, "dockerFile": "D", "context": ".",
        "build": {"dockerfile": "D", "context": ".", "args": {"V": "1"}, "target": "dev",
                  "cacheFrom": ["ghcr.io/o/cache:1"]}}"#;
    let config = parse(text).expect("every allowed key");
    assert_eq!(config.image.as_deref(), Some("debian"));
    for key in ALLOWED {
        assert!(text.contains(&format!("\"{key}\"")), "{key} is in the test");
    }
}

#[test]
fn keys_that_reach_the_engines_host_are_refused_by_name() {
    for (key, value) in [
        ("mounts", r#"["type=bind,source=/,target=/host"]"#),
        ("workspaceMount", r#""type=bind,source=/home,target=/w""#),
        ("runArgs", r#"["--privileged"]"#),
        ("privileged", "true"),
        ("capAdd", r#"["SYS_ADMIN"]"#),
        ("securityOpt", r#"["seccomp=unconfined"]"#),
        ("init", "true"),
        ("appPort", "[8080]"),
        ("hostRequirements", r#"{"gpu": true}"#),
    ] {
        let err = refusal(&format!(r#"{{"image": "x", "{key}": {value}}}"#));
        assert!(
            err.starts_with(&format!("`{key}` is not allowed: it reaches the engine's host configuration of the setup container (")),
            "{key}: {err}"
        );
        assert!(
            err.ends_with("rover refuses keys it does not know to be safe"),
            "{err}"
        );
    }
    // Empty or false still asks the CLI for something (`"dockerComposeFile": []` reads
    // `COMPOSE_FILE` from the checkout's `.env`): refused all the same.
    for (key, value) in [
        ("runArgs", "[]"),
        ("privileged", "false"),
        ("workspaceMount", r#""""#),
        ("dockerComposeFile", "[]"),
        ("mounts", "null"),
    ] {
        let err = refusal(&format!(r#"{{"image": "x", "{key}": {value}}}"#));
        assert!(
            err.starts_with(&format!("`{key}` is not allowed")),
            "{key}: {err}"
        );
    }
}

#[test]
fn build_options_and_unknown_build_keys_are_refused_by_name() {
    let err = refusal(r#"{"build": {"dockerfile": "D", "options": ["--network=host"]}}"#);
    assert!(
        err.starts_with(
            "`build.options` is not allowed: it reaches the engine's host configuration"
        ),
        "{err}"
    );
    assert!(err.contains("--secret"), "{err}");
    let err = refusal(r#"{"build": {"dockerfile": "D", "secrets": {}}}"#);
    assert!(err.starts_with("`build.secrets` is not allowed"), "{err}");
    for cache in [
        r#""type=local,src=/root""#,
        r#"["x", "type=registry,ref=y"]"#,
    ] {
        let err = refusal(&format!(
            r#"{{"build": {{"dockerfile": "D", "cacheFrom": {cache}}}}}"#
        ));
        assert!(err.starts_with("`build.cacheFrom` is not allowed"), "{err}");
    }
}

#[test]
fn keys_rover_does_not_know_are_refused_with_the_reason() {
    for key in [
        "secrets",
        "overrideFeatureInstallOrder",
        "__proto__",
        "futureKey",
    ] {
        let err = refusal(&format!(r#"{{"image": "x", "{key}": {{}}}}"#));
        assert!(
            err.starts_with(&format!(
                "`{key}` is not allowed: it is not one of the keys rover knows"
            )),
            "{key}: {err}"
        );
    }
    // An escaped key is the key it decodes to.
    let err = refusal(r#"{"image": "x", "run\u0041rgs": ["--privileged"]}"#);
    assert!(err.starts_with("`runArgs` is not allowed"), "{err}");
}

#[test]
fn refuses_features_compose_host_commands_and_nothing_to_build() {
    for (text, word) in [
        (
            r#"{"image":"x","features":{"ghcr.io/devcontainers/features/node:1":{}}}"#,
            "`features` is not allowed: features are fetched",
        ),
        (
            r#"{"dockerComposeFile":"c.yml","service":"app"}"#,
            "Compose",
        ),
        (
            r#"{"image":"x","initializeCommand":"make"}"#,
            "`initializeCommand` is not allowed: it runs on the host",
        ),
        (r#"{"name":"nothing"}"#, "neither"),
        (r#"{"image":"--privileged"}"#, "not an image name"),
        ("[1]", "object"),
        ("{", "not JSON"),
    ] {
        let err = refusal(text);
        assert!(err.contains(word), "{text}: {err}");
    }
    // An empty `features` is nothing to refuse.
    assert!(parse(r#"{"image":"x","features":{}}"#).is_ok());
}

#[test]
fn local_env_home_is_refused_without_the_allow_list_and_read_with_it() {
    let text = r#"{"build": {"dockerfile": "Dockerfile", "context": "${localEnv:HOME}"}}"#;
    let err = refusal(text);
    assert_eq!(
        err,
        "`build.context` reads `${localEnv:HOME}`, a variable of rover's environment definitions may not read; to let them, add `HOME` to `autopilot.sandbox.environment.localEnv` in rover.json"
    );
    // Allowed, its value is the path: a relative one is resolved as the CLI would.
    let config = parse_devcontainer(text, &home_allowed()).expect("allowed");
    assert_eq!(config.context.expect("a context").path, "home/rover");
    // The host's home is an absolute path: refused even when allowed.
    let abs = LocalEnv::new([("HOME".to_owned(), Some("/root".to_owned()))]);
    let err = parse_devcontainer(text, &abs).expect_err("absolute");
    assert!(
        err.starts_with("`build.context` (`${localEnv:HOME}`) is an absolute path"),
        "{err}"
    );
}

#[test]
fn env_is_the_same_as_local_env_anywhere_in_the_definition() {
    for text in [
        r#"{"image": "x", "containerEnv": {"H": "${env:HOME}"}}"#,
        r#"{"image": "x", "containerEnv": {"H": "${localEnv:HOME:/default}"}}"#,
        r#"{"image": "x", "postCreateCommand": ["echo", "${localEnv:HOME}"]}"#,
        r#"{"image": "x", "customizations": {"t": {"${env:HOME}": 1}}}"#,
        r#"{"image": "${localEnv:HOME}"}"#,
        r#"{"image": "x", "remoteEnv": {"A": "${ LOCALENV:HOME}"}}"#,
    ] {
        let err = refusal(text);
        assert!(
            err.contains("HOME") && err.contains(LOCAL_ENV_KEY),
            "{text}: {err}"
        );
        assert!(parse_devcontainer(text, &home_allowed()).is_ok(), "{text}");
    }
    let err = refusal(r#"{"image": "x", "containerEnv": {"H": "${env:HOME}"}}"#);
    assert!(
        err.starts_with("`containerEnv.H` reads `${env:HOME}`"),
        "{err}"
    );
    let err = refusal(r#"{"image": "x", "postCreateCommand": ["a", "${localEnv:TOKEN}"]}"#);
    assert!(err.starts_with("`postCreateCommand[1]` reads"), "{err}");
    // Other variables are the CLI's own, with nothing of rover's environment.
    assert!(parse(r#"{"image": "x", "containerEnv": {"W": "${containerWorkspaceFolder}", "I": "${devcontainerId}"}}"#).is_ok());
    assert!(refusal(r#"{"image": "x", "name": "${localEnv}"}"#).contains("names no variable"));
}

#[test]
fn local_workspace_folder_is_the_root_and_paths_stay_inside() {
    let tools =
        parse(r#"{"build": {"dockerfile": "D", "context": "${localWorkspaceFolder}/tools"}}"#)
            .expect("inside");
    let context = tools.context.expect("a context");
    assert!(context.from_root);
    assert_eq!(context.path, "/tools");
    let root = parse(r#"{"build": {"dockerfile": "D", "context": "${localWorkspaceFolder}"}}"#)
        .expect("the root");
    assert_eq!(
        root.context.map(|c| (c.from_root, c.path)),
        Some((true, String::new()))
    );
    for (context, word) in [
        ("${localWorkspaceFolder}tools", "beside the checkout"),
        ("/home", "absolute"),
        ("${localWorkspaceFolderBasename}", "rover resolves only"),
        ("x/${localWorkspaceFolder}", "rover resolves only"),
        ("${containerWorkspaceFolder}/x", "rover resolves only"),
        ("a${b", "cannot resolve"),
    ] {
        let err = refusal(&format!(
            r#"{{"build": {{"dockerfile": "D", "context": "{context}"}}}}"#
        ));
        assert!(
            err.starts_with("`build.context`") && err.contains(word),
            "{context}: {err}"
        );
    }
    // Every path key is checked, the ones the CLI would not use too.
    let err = refusal(r#"{"dockerFile": "D", "build": {"dockerfile": "/etc/passwd"}}"#);
    assert!(
        err.starts_with("`build.dockerfile` (`/etc/passwd`) is an absolute path"),
        "{err}"
    );
}

#[test]
fn the_older_docker_file_key_takes_the_top_level_context_as_the_cli_does() {
    let config = parse(
        r#"{"dockerFile": "D", "context": "..", "build": {"dockerfile": "B", "context": "."}}"#,
    )
    .expect("valid");
    assert_eq!(
        config.dockerfile.map(|d| d.key).as_deref(),
        Some("dockerFile")
    );
    assert_eq!(config.context.map(|c| c.key).as_deref(), Some("context"));
    assert_eq!(config.paths.len(), 4);
    // An empty context is none: the CLI builds in the Dockerfile's directory.
    let config = parse(r#"{"build": {"dockerfile": "D", "context": ""}}"#).expect("valid");
    assert_eq!(config.context, None);
}

#[test]
fn references_include_all_the_cli_substitutes() {
    let found: Vec<&str> = references("${a}${b\n${localEnv:X}} $ {c} ${d").collect();
    assert_eq!(found, ["a", "b\n${localEnv:X", "localEnv:X"]);
}
