// src/protocol.ts is generated from runner/protocol.schema.json: a change to the schema without
// `npm run generate` fails here.
import { readFile } from "node:fs/promises";
import { expect, it } from "vitest";
import { generate, OUTPUT } from "../scripts/generate-types.mjs";

it("src/protocol.ts is what the schema generates", async () => {
  const committed = await readFile(OUTPUT, "utf8");
  expect(committed, "run `npm run generate` in clients/typescript").toBe(await generate());
});
