//! All printing goes through one `Output`: it knows whether colour is wanted and turns a closed
//! pipe (`rover autopilot traces | head`) into a quiet success.

use std::io::{self, IsTerminal, Write};

use super::CliError;
use crate::trace::Style;

pub struct Output {
    writer: Box<dyn Write>,
    style: Style,
}

impl Output {
    /// Standard output; colour when it is a terminal and `NO_COLOR` is unset.
    pub fn stdout() -> Output {
        let color =
            io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        Output {
            writer: Box::new(io::stdout()),
            style: Style { color },
        }
    }

    /// Any writer, without colour (tests).
    pub fn to(writer: Box<dyn Write>) -> Output {
        Output {
            writer,
            style: Style::default(),
        }
    }

    pub fn style(&self) -> Style {
        self.style
    }

    pub fn print(&mut self, text: &str) -> Result<(), CliError> {
        self.writer
            .write_all(text.as_bytes())
            .and_then(|()| self.writer.flush())
            .map_err(CliError::Output)
    }

    pub fn json(&mut self, value: &serde_json::Value) -> Result<(), CliError> {
        let mut text = serde_json::to_string_pretty(value).expect("json values serialize");
        text.push('\n');
        self.print(&text)
    }
}
