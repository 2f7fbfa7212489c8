//! Structured answers: the schema handed to the CLI comes from the result type, the answer is
//! parsed into that type, and an invalid answer gets exactly one retry in the same session.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde_json::Value;

use super::agent::Agent;
use super::error::AgentError;
use super::prompts::untrusted_block;
use super::results::StepResult;
use super::types::{AgentRequest, AgentResponse};

/// Longest raw answer quoted back to the agent on the retry.
const MAX_QUOTED_ANSWER: usize = 8 * 1024;

/// A validated result with the response it came from.
#[derive(Debug, Clone)]
pub struct Structured<T> {
    /// The typed result.
    pub value: T,
    /// The final response (of the retry, if there was one).
    pub response: AgentResponse,
    /// 1, or 2 when the first answer was rejected.
    pub attempts: u32,
    /// Why the first answer was rejected, when it was.
    pub first_error: Option<String>,
}

/// The JSON schema of `T` in the strict form both CLIs accept.
pub fn schema_for<T: JsonSchema>() -> Value {
    let schema = schemars::schema_for!(T);
    strict_schema(serde_json::to_value(schema).expect("a generated schema is valid json"))
}

/// Rewrites a schema for OpenAI strict mode (which claude also accepts): every object closed
/// (`additionalProperties: false`) with all properties required (optional ones allow `null`),
/// `oneOf` as `anyOf`, and no `format` or `$schema` keywords.
pub fn strict_schema(mut schema: Value) -> Value {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("$schema");
                if map.get("format").is_some_and(Value::is_string) {
                    map.remove("format");
                }
                // Strict mode wants a bare `$ref`, without sibling keywords.
                if map.contains_key("$ref") {
                    map.retain(|key, _| key == "$ref");
                    return;
                }
                if let Some(one_of) = map.remove("oneOf") {
                    map.insert("anyOf".to_owned(), one_of);
                }
                if let Some(Value::Object(properties)) = map.get("properties") {
                    let keys: Vec<Value> = properties.keys().cloned().map(Value::String).collect();
                    map.insert("required".to_owned(), Value::Array(keys));
                    map.insert("additionalProperties".to_owned(), Value::Bool(false));
                }
                map.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut schema);
    schema
}

/// The candidate JSON of a response: the CLI's structured output, else the whole answer text
/// parsed as JSON (a single fenced block around the whole text is accepted). Never scraped out
/// of prose.
fn candidate(response: &AgentResponse) -> Result<Value, String> {
    if let Some(value) = &response.structured {
        return Ok(value.clone());
    }
    let text = response.text.trim();
    let text = text
        .strip_prefix("```json")
        .or_else(|| text.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .map_or(text, str::trim);
    serde_json::from_str(text).map_err(|err| format!("the answer is not a JSON object: {err}"))
}

/// Parses and validates a response as `T`; the error is worded for the agent.
pub fn extract<T: StepResult>(response: &AgentResponse) -> Result<T, String> {
    let value = candidate(response)?;
    let typed: T = serde_json::from_value(value)
        .map_err(|err| format!("the JSON does not match the schema: {err}"))?;
    typed.validate()?;
    Ok(typed)
}

fn raw_answer(response: &AgentResponse) -> String {
    response
        .structured
        .as_ref()
        .map_or_else(|| response.text.clone(), Value::to_string)
}

fn with_suffix(path: Option<&PathBuf>, suffix: &str) -> Option<PathBuf> {
    path.map(|p| {
        let mut name = p.clone().into_os_string();
        name.push(suffix);
        PathBuf::from(name)
    })
}

/// Runs `req` asking for a `T`; on an invalid answer asks once more in the same session,
/// showing the validation error; then fails with the raw answer kept.
pub async fn run_structured<T: StepResult>(
    agent: &dyn Agent,
    mut req: AgentRequest,
) -> Result<Structured<T>, AgentError> {
    req.schema = Some(schema_for::<T>());
    let first = agent.run(req.clone()).await?;
    let first_error = match extract::<T>(&first) {
        Ok(value) => {
            return Ok(Structured {
                value,
                response: first,
                attempts: 1,
                first_error: None,
            })
        }
        Err(err) => err,
    };
    let raw = raw_answer(&first);
    let quoted = super::truncate_marked(&raw, MAX_QUOTED_ANSWER);
    // The answer, and the error that quotes parts of it, are the agent's text: data.
    let correction = format!(
        "Your previous answer was rejected:\n{}\n\nPrevious answer:\n{}\n\n\
         Reply again with only the corrected JSON object that matches the required schema.",
        untrusted_block("why rover rejected the answer", &first_error),
        untrusted_block("your previous answer", &quoted)
    );
    let mut retry = req.clone();
    retry.transcript = with_suffix(req.transcript.as_ref(), ".retry");
    match &first.session_id {
        Some(session) => {
            retry.resume_session = Some(session.clone());
            retry.prompt = correction;
        }
        // No session to resume: start over with the correction appended.
        None => retry.prompt = format!("{}\n\n{correction}", req.prompt),
    }
    let second = agent.run(retry).await?;
    match extract::<T>(&second) {
        Ok(value) => Ok(Structured {
            value,
            response: second,
            attempts: 2,
            first_error: Some(first_error),
        }),
        Err(reason) => Err(AgentError::InvalidAnswer {
            reason,
            raw: raw_answer(&second),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::results::{
        CommitMessageResult, CoordinateDecision, CoordinateResult, PlanResult, ResolveResult,
    };

    fn response(structured: Option<Value>, text: &str) -> AgentResponse {
        AgentResponse {
            structured,
            text: text.to_owned(),
            ..AgentResponse::default()
        }
    }

    #[test]
    fn strict_schema_closes_objects_and_requires_all_properties() {
        let schema = schema_for::<CoordinateResult>();
        assert_eq!(schema["additionalProperties"], Value::Bool(false));
        let required: Vec<&str> = schema["required"]
            .as_array()
            .expect("required list")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for key in ["decision", "confidence", "reasoning", "directive", "task"] {
            assert!(required.contains(&key), "{key} missing in {required:?}");
        }
        let text = schema.to_string();
        assert!(!text.contains("\"format\""), "{text}");
        assert!(!text.contains("oneOf"), "{text}");
        assert!(!text.contains("$schema"), "{text}");
        assert_eq!(
            schema["properties"]["decision"],
            serde_json::json!({"$ref": "#/$defs/CoordinateDecision"})
        );
        let task = &schema["$defs"]["TaskSpec"];
        assert_eq!(task["additionalProperties"], Value::Bool(false));
    }

    #[test]
    fn structured_output_wins_and_text_is_only_a_whole_json_fallback() {
        let good = serde_json::json!({"decision":"noop","confidence":0.9,"reasoning":"ci green",
            "directive":null,"task":null,"message":null,"condition":null,"task_id":null});
        let parsed: CoordinateResult =
            extract(&response(Some(good.clone()), "prose")).expect("structured output");
        assert_eq!(parsed.decision, CoordinateDecision::Noop);
        let fenced = format!("```json\n{good}\n```");
        assert!(extract::<CoordinateResult>(&response(None, &fenced)).is_ok());
        let prose = format!("Here is my answer: {good} hope it helps");
        let err = extract::<CoordinateResult>(&response(None, &prose)).expect_err("prose");
        assert!(err.contains("not a JSON object"), "{err}");
    }

    #[test]
    fn validation_rules_reject_what_serde_accepts() {
        let plan = serde_json::json!({"analysis":"a","tasks":[
            {"id":"a","title":"t","description":"d","acceptance_criteria":[],"workflow_type":"swe","depends_on":["b"]},
            {"id":"b","title":"t","description":"d","acceptance_criteria":[],"workflow_type":"code-review","depends_on":["a"]}],
            "clarification":null});
        let err = extract::<PlanResult>(&response(Some(plan), "")).expect_err("cycle");
        assert!(err.contains("cycle"), "{err}");
        let commit = serde_json::json!({"subject":"Fix parser","body":"Co-Authored-By: Claude <noreply@anthropic.com>"});
        let err = extract::<CommitMessageResult>(&response(Some(commit), "")).expect_err("attr");
        assert!(err.contains("attribution"), "{err}");
        let resolve = serde_json::json!({"decision":"iterate","reasoning":"r","instructions":null,
            "retry_step":null,"message":null,"corrective_commands":[]});
        let err = extract::<ResolveResult>(&response(Some(resolve), "")).expect_err("instr");
        assert!(err.contains("instructions"), "{err}");
        let wrong_enum = serde_json::json!({"decision":"maybe","confidence":0.5,"reasoning":"r",
            "directive":null,"task":null,"message":null,"condition":null,"task_id":null});
        let err = extract::<CoordinateResult>(&response(Some(wrong_enum), "")).expect_err("enum");
        assert!(err.contains("maybe"), "{err}");
    }
}
