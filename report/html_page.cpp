// The HTML around a report's data: a style sheet, the data block and the
// drawing script (report_script.cpp), all inline.
#include <string>

#include <nlohmann/json.hpp>

#include "report/html_report.h"

namespace weft::report {

extern const char* const kReportScript;

namespace {

const char* const kStyle = R"css(
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1a202c;
       margin: 24px auto; max-width: 1120px; padding: 0 12px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 12px; }
h2 { font-size: 17px; margin: 28px 0 6px; border-bottom: 1px solid #e2e8f0; padding-bottom: 4px; }
h2.part { font-size: 20px; border-bottom: 2px solid #2b6cb0; }
p.note { color: #4a5568; margin: 4px 0 8px; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; margin: 0 0 8px; }
dt { color: #4a5568; } dd { margin: 0; }
svg { display: block; margin: 6px 0 10px; }
svg text { font: 12px system-ui, Helvetica, Arial, sans-serif; fill: #2d3748; }
svg text.ctitle { font-size: 14px; font-weight: 600; }
svg text.label { font-size: 13px; }
svg text.tick { font-size: 11px; }
svg text.legend { font-size: 12px; }
svg .grid { stroke: #edf2f7; } svg .axis { stroke: #4a5568; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 12.5px; }
th, td { border: 1px solid #e2e8f0; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f7fafc; }
td { font-variant-numeric: tabular-nums; }
#weft-errors { color: #c53030; white-space: pre-wrap; font-family: monospace; }
)css";

// Text safe inside HTML elements and attributes.
std::string escape_html(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// JSON safe inside a <script> element: "</" would end the element early and
// "<!--" would start an HTML comment. '<' occurs only inside JSON strings,
// where \u003c reads back as the same character.
std::string script_safe_json(const nlohmann::json& data) {
  const std::string text = data.dump();
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

}  // namespace

std::string report_html(const nlohmann::json& data) {
  const std::string title = escape_html(data.value("title", std::string("weft report")));
  std::string page = "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page += "<title>" + title + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  page += "<h1>" + title + "</h1>\n<div id=\"weft-errors\"></div>\n<main id=\"weft-main\"></main>\n";
  page += "<noscript>The plots of this report are drawn by its inline script; allow JavaScript to see them."
          "</noscript>\n";
  // Errors anywhere in drawing end up on the page, where a reader (and the
  // browser test, through the DOM) sees them.
  page += "<script>window.weftError = function (m) { document.body.dataset.weft = \"error\"; "
          "document.getElementById(\"weft-errors\").textContent += \"report error: \" + m + \"\\n\"; };\n"
          "window.onerror = function (m, src, line) { window.weftError(m + \" (line \" + line + \")\"); };"
          "</script>\n";
  page += "<script type=\"application/json\" id=\"weft-data\">" + script_safe_json(data) + "</script>\n";
  page += "<script>" + std::string(kReportScript) + "</script>\n</body>\n</html>\n";
  return page;
}

}  // namespace weft::report
