// The heads page: the heads view (heads_view.js) of the page's data.
"use strict";

headsView(JSON.parse(document.getElementById("data").textContent));
