export const SCHEMA: string;
export const OUTPUT: string;
export const TYPES: string[];
export function generate(): Promise<string>;
