// The page's entry point: tabs, the API-key panel, and the tabs' controllers.

import { apiKey, onUnauthorized, setApiKey } from "./api.js";
import { Chat } from "./chat.js";
import { Classic } from "./classic.js";
import { Ocr } from "./ocr.js";

const $ = (id) => document.getElementById(id);

function tabs() {
  const pairs = [["tab-chat", "panel-chat"], ["tab-classic", "panel-classic"], ["tab-ocr", "panel-ocr"]];
  for (const [tab, panel] of pairs) {
    $(tab).addEventListener("click", () => {
      for (const [t, p] of pairs) {
        $(t).setAttribute("aria-selected", String(t === tab));
        $(p).hidden = p !== panel;
      }
    });
  }
}

// With API keys on, the server answers 401: the panel opens with the server's message, and
// a key given there lives in sessionStorage (this tab only) and goes out as a bearer token.
function keyPanel(chat) {
  const panel = $("key-panel");
  const error = $("key-error");
  const open = (message) => {
    panel.hidden = false;
    error.textContent = message || "";
    error.hidden = !message;
    $("key-input").value = apiKey();
    $("key-input").focus();
  };
  onUnauthorized((err) => open(err.message));
  $("key-open").addEventListener("click", () => (panel.hidden ? open("") : (panel.hidden = true)));
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    setApiKey($("key-input").value.trim());
    error.hidden = true;
    if (await chat.loadModels()) panel.hidden = true;
  });
  $("key-forget").addEventListener("click", () => {
    setApiKey("");
    $("key-input").value = "";
  });
}

const chat = new Chat();
new Classic();
new Ocr();
tabs();
keyPanel(chat);
chat.loadModels();
