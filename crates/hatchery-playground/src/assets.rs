//! The widget and the demo page, compiled into the binary.

pub const WIDGET_JS: &str = include_str!("../../../web/playground/widget.js");
pub const WIDGET_CSS: &str = include_str!("../../../web/playground/widget.css");
pub const DEMO_HTML: &str = include_str!("../../../web/playground/demo.html");
