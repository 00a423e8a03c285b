//! The embedded catalog: one redb file (`DIR/catalog.redb`) on the node.
//!
//! Layout: table `volumes` maps name → (revision, record JSON), and one
//! table per policy [`Collection`] (named [`Collection::dir`]) maps an
//! entry's name → (revision, JSON) the same way; table `meta`
//! holds `schema_version` and `revision`, the last revision handed out. Every
//! mutation runs in one write transaction that bumps `revision`, checks its
//! precondition and commits durably, so a crash leaves either the old or the
//! new state. redb locks the file, so one process at a time owns a catalog.

use crate::{Catalog, CatalogError, Collection, Revision, Versioned, VolumeRecord};
use redb::{Database, ReadableTable, TableDefinition};
use std::path::{Path, PathBuf};

const VOLUMES: TableDefinition<&str, (u64, &str)> = TableDefinition::new("volumes");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const COLLECTIONS: [Collection; 5] = [
    Collection::Projects,
    Collection::Tokens,
    Collection::VolumeTypes,
    Collection::Settings,
    Collection::NbdKeys,
];

type Table<'t> = redb::Table<'t, &'static str, (u64, &'static str)>;

/// The table of a policy collection.
fn entries(collection: Collection) -> TableDefinition<'static, &'static str, (u64, &'static str)> {
    TableDefinition::new(collection.dir())
}
const META_SCHEMA_VERSION: &str = "schema_version";
const META_REVISION: &str = "revision";
/// The schema this code writes. Bump only for changes older code cannot read
/// (a new record field is not such a change; see `record.rs`).
const SCHEMA_VERSION: u64 = 1;

/// A [`Catalog`] stored in a local redb file.
pub struct RedbCatalog {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for RedbCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbCatalog")
            .field("path", &self.path)
            .finish()
    }
}

fn backend(e: impl Into<redb::Error>) -> CatalogError {
    CatalogError::backend(e.into())
}

impl RedbCatalog {
    /// Opens the catalog at `path`, creating an empty one if the file does not
    /// exist. Fails with [`CatalogError::Locked`] if another process has it
    /// open and [`CatalogError::UnsupportedSchema`] if a newer basalt wrote it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CatalogError> {
        let path = path.as_ref().to_path_buf();
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => CatalogError::Locked(path.clone()),
            other => backend(other),
        })?;
        let txn = db.begin_write().map_err(backend)?;
        {
            let mut meta = txn.open_table(META).map_err(backend)?;
            let found = meta
                .get(META_SCHEMA_VERSION)
                .map_err(backend)?
                .map(|v| v.value());
            match found {
                Some(found) if found > SCHEMA_VERSION => {
                    return Err(CatalogError::UnsupportedSchema {
                        found,
                        supported: SCHEMA_VERSION,
                    })
                }
                Some(_) => {}
                None => {
                    meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION)
                        .map_err(backend)?;
                }
            }
            txn.open_table(VOLUMES).map_err(backend)?;
            for collection in COLLECTIONS {
                txn.open_table(entries(collection)).map_err(backend)?;
            }
        }
        txn.commit().map_err(backend)?;
        Ok(RedbCatalog { db, path })
    }

    /// The file this catalog lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on table `table` in a write transaction with the next
    /// revision number; commits (durably) only if `f` succeeds.
    fn mutate<T>(
        &self,
        table: TableDefinition<&'static str, (u64, &'static str)>,
        f: impl FnOnce(&mut Table, Revision) -> Result<T, CatalogError>,
    ) -> Result<T, CatalogError> {
        let txn = self.db.begin_write().map_err(backend)?;
        let out = {
            let mut meta = txn.open_table(META).map_err(backend)?;
            let last = meta
                .get(META_REVISION)
                .map_err(backend)?
                .map(|v| v.value())
                .unwrap_or(0);
            let next = last + 1;
            meta.insert(META_REVISION, next).map_err(backend)?;
            let mut table = txn.open_table(table).map_err(backend)?;
            f(&mut table, Revision::new(next))?
        };
        txn.commit().map_err(backend)?;
        Ok(out)
    }
}

/// The revision currently stored under `name`, if any.
fn current_revision(table: &Table, name: &str) -> Result<Option<Revision>, CatalogError> {
    Ok(table
        .get(name)
        .map_err(backend)?
        .map(|v| Revision::new(v.value().0)))
}

fn check_expected(table: &Table, name: &str, expected: Revision) -> Result<(), CatalogError> {
    match current_revision(table, name)? {
        None => Err(CatalogError::NotFound(name.to_string())),
        Some(found) if found != expected => Err(CatalogError::Conflict {
            name: name.to_string(),
            expected,
            found,
        }),
        Some(_) => Ok(()),
    }
}

impl RedbCatalog {
    /// Every (name, revision, JSON) of `table`, ordered by name.
    fn read_all(
        &self,
        table: TableDefinition<&'static str, (u64, &'static str)>,
    ) -> Result<Vec<(String, Revision, String)>, CatalogError> {
        let txn = self.db.begin_read().map_err(backend)?;
        let table = txn.open_table(table).map_err(backend)?;
        let mut out = Vec::new();
        for entry in table.iter().map_err(backend)? {
            let (key, value) = entry.map_err(backend)?;
            let (revision, json) = value.value();
            out.push((
                key.value().to_string(),
                Revision::new(revision),
                json.to_string(),
            ));
        }
        Ok(out)
    }

    /// The (revision, JSON) stored under `name` in `table`.
    fn read_one(
        &self,
        table: TableDefinition<&'static str, (u64, &'static str)>,
        name: &str,
    ) -> Result<Option<(Revision, String)>, CatalogError> {
        let txn = self.db.begin_read().map_err(backend)?;
        let table = txn.open_table(table).map_err(backend)?;
        let found = table.get(name).map_err(backend)?;
        Ok(found.map(|guard| {
            let (revision, json) = guard.value();
            (Revision::new(revision), json.to_string())
        }))
    }

    fn put_new(
        &self,
        table: TableDefinition<&'static str, (u64, &'static str)>,
        name: &str,
        json: &str,
    ) -> Result<Revision, CatalogError> {
        self.mutate(table, |table, revision| {
            if current_revision(table, name)?.is_some() {
                return Err(CatalogError::AlreadyExists(name.to_string()));
            }
            table
                .insert(name, (revision.get(), json))
                .map_err(backend)?;
            Ok(revision)
        })
    }

    fn swap(
        &self,
        table: TableDefinition<&'static str, (u64, &'static str)>,
        name: &str,
        json: &str,
        expected: Revision,
    ) -> Result<Revision, CatalogError> {
        self.mutate(table, |table, revision| {
            check_expected(table, name, expected)?;
            table
                .insert(name, (revision.get(), json))
                .map_err(backend)?;
            Ok(revision)
        })
    }

    fn remove(
        &self,
        table: TableDefinition<&'static str, (u64, &'static str)>,
        name: &str,
        expected: Revision,
    ) -> Result<(), CatalogError> {
        self.mutate(table, |table, _| {
            check_expected(table, name, expected)?;
            table.remove(name).map_err(backend)?;
            Ok(())
        })
    }
}

impl Catalog for RedbCatalog {
    fn get(&self, name: &str) -> Result<Option<Versioned<VolumeRecord>>, CatalogError> {
        let Some((revision, json)) = self.read_one(VOLUMES, name)? else {
            return Ok(None);
        };
        Ok(Some(Versioned {
            revision,
            record: VolumeRecord::from_json(name, &json)?,
        }))
    }

    fn list(&self) -> Result<Vec<Versioned<VolumeRecord>>, CatalogError> {
        self.read_all(VOLUMES)?
            .into_iter()
            .map(|(name, revision, json)| {
                Ok(Versioned {
                    revision,
                    record: VolumeRecord::from_json(&name, &json)?,
                })
            })
            .collect()
    }

    fn insert(&self, record: &VolumeRecord) -> Result<Revision, CatalogError> {
        self.put_new(VOLUMES, &record.name, &record.to_json())
    }

    fn update(&self, record: &VolumeRecord, expected: Revision) -> Result<Revision, CatalogError> {
        self.swap(VOLUMES, &record.name, &record.to_json(), expected)
    }

    fn delete(&self, name: &str, expected: Revision) -> Result<(), CatalogError> {
        self.remove(VOLUMES, name, expected)
    }

    fn get_entry(
        &self,
        collection: Collection,
        name: &str,
    ) -> Result<Option<Versioned<String>>, CatalogError> {
        Ok(self
            .read_one(entries(collection), name)?
            .map(|(revision, record)| Versioned { revision, record }))
    }

    fn list_entries(
        &self,
        collection: Collection,
    ) -> Result<Vec<(String, Versioned<String>)>, CatalogError> {
        Ok(self
            .read_all(entries(collection))?
            .into_iter()
            .map(|(name, revision, record)| (name, Versioned { revision, record }))
            .collect())
    }

    fn insert_entry(
        &self,
        collection: Collection,
        name: &str,
        json: &str,
    ) -> Result<Revision, CatalogError> {
        self.put_new(entries(collection), name, json)
    }

    fn update_entry(
        &self,
        collection: Collection,
        name: &str,
        json: &str,
        expected: Revision,
    ) -> Result<Revision, CatalogError> {
        self.swap(entries(collection), name, json, expected)
    }

    fn delete_entry(
        &self,
        collection: Collection,
        name: &str,
        expected: Revision,
    ) -> Result<(), CatalogError> {
        self.remove(entries(collection), name, expected)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;
    use uuid::Uuid;

    fn record(name: &str, size: u64) -> VolumeRecord {
        VolumeRecord::new(Uuid::new_v4(), name, size, SystemTime::now())
    }

    fn open_temp() -> (tempfile::TempDir, RedbCatalog) {
        let dir = tempfile::tempdir().unwrap();
        let cat = RedbCatalog::open(dir.path().join("catalog.redb")).unwrap();
        (dir, cat)
    }

    #[test]
    fn insert_get_list() {
        let (_dir, cat) = open_temp();
        assert!(cat.get("a").unwrap().is_none());
        assert!(cat.list().unwrap().is_empty());
        let b = record("b", 8192);
        let a = record("a", 4096);
        let rb = cat.insert(&b).unwrap();
        let ra = cat.insert(&a).unwrap();
        assert!(ra > rb, "revisions grow");
        let got = cat.get("a").unwrap().unwrap();
        assert_eq!(got.record, a);
        assert_eq!(got.revision, ra);
        let names: Vec<_> = cat
            .list()
            .unwrap()
            .into_iter()
            .map(|v| v.record.name)
            .collect();
        assert_eq!(names, ["a", "b"], "list is ordered by name");
    }

    #[test]
    fn names_are_unique() {
        let (_dir, cat) = open_temp();
        let first = record("vol", 4096);
        cat.insert(&first).unwrap();
        let err = cat.insert(&record("vol", 8192)).unwrap_err();
        assert!(
            matches!(err, CatalogError::AlreadyExists(ref n) if n == "vol"),
            "{err}"
        );
        assert_eq!(
            cat.get("vol").unwrap().unwrap().record,
            first,
            "first record kept"
        );
    }

    #[test]
    fn update_is_compare_and_swap() {
        let (_dir, cat) = open_temp();
        let mut rec = record("vol", 4096);
        let r1 = cat.insert(&rec).unwrap();
        rec.size_bytes = 8192;
        let r2 = cat.update(&rec, r1).unwrap();
        assert!(r2 > r1);
        assert_eq!(cat.get("vol").unwrap().unwrap().record.size_bytes, 8192);

        rec.size_bytes = 12288;
        let err = cat.update(&rec, r1).unwrap_err();
        match err {
            CatalogError::Conflict {
                expected, found, ..
            } => {
                assert_eq!((expected, found), (r1, r2))
            }
            other => panic!("expected conflict, got {other}"),
        }
        assert_eq!(cat.get("vol").unwrap().unwrap().record.size_bytes, 8192);

        let err = cat.update(&record("ghost", 4096), r2).unwrap_err();
        assert!(matches!(err, CatalogError::NotFound(_)), "{err}");
    }

    #[test]
    fn delete_is_compare_and_swap() {
        let (_dir, cat) = open_temp();
        let mut rec = record("vol", 4096);
        let r1 = cat.insert(&rec).unwrap();
        rec.size_bytes = 8192;
        let r2 = cat.update(&rec, r1).unwrap();
        assert!(matches!(
            cat.delete("vol", r1),
            Err(CatalogError::Conflict { .. })
        ));
        cat.delete("vol", r2).unwrap();
        assert!(cat.get("vol").unwrap().is_none());
        assert!(matches!(
            cat.delete("vol", r2),
            Err(CatalogError::NotFound(_))
        ));
    }

    #[test]
    fn revisions_are_never_reused_after_delete() {
        let (_dir, cat) = open_temp();
        let r1 = cat.insert(&record("vol", 4096)).unwrap();
        cat.delete("vol", r1).unwrap();
        let r2 = cat.insert(&record("vol", 4096)).unwrap();
        assert!(r2 > r1);
        // A stale delete aimed at the old volume must not remove the new one.
        assert!(matches!(
            cat.delete("vol", r1),
            Err(CatalogError::Conflict { .. })
        ));
    }

    #[test]
    fn records_persist_across_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let rec = record("vol", 1 << 20);
        let rev = {
            let cat = RedbCatalog::open(&path).unwrap();
            cat.insert(&rec).unwrap()
        };
        let cat = RedbCatalog::open(&path).unwrap();
        let got = cat.get("vol").unwrap().unwrap();
        assert_eq!((got.revision, got.record), (rev, rec));
        assert!(cat.insert(&record("other", 4096)).unwrap() > rev);
    }

    #[test]
    fn second_open_of_same_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let _first = RedbCatalog::open(&path).unwrap();
        let err = RedbCatalog::open(&path).unwrap_err();
        assert!(matches!(err, CatalogError::Locked(_)), "{err}");
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        drop(RedbCatalog::open(&path).unwrap());
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(META)
                .unwrap()
                .insert(META_SCHEMA_VERSION, SCHEMA_VERSION + 1)
                .unwrap();
            txn.commit().unwrap();
        }
        let err = RedbCatalog::open(&path).unwrap_err();
        assert!(
            matches!(err, CatalogError::UnsupportedSchema { .. }),
            "{err}"
        );
    }

    #[test]
    fn records_with_fields_from_newer_versions_are_read() {
        // A record as a newer basalt would have written it, stored raw.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.redb");
        let cat = RedbCatalog::open(&path).unwrap();
        let raw = r#"{"id":"67e55044-10b1-426f-9247-bb680e5fe0c8","name":"old","size_bytes":4096,"created_at":"2024-01-01T00:00:00Z","future":true}"#;
        cat.mutate(VOLUMES, |t, rev| {
            t.insert("old", (rev.get(), raw)).map_err(backend)?;
            Ok(())
        })
        .unwrap();
        let got = cat.get("old").unwrap().unwrap().record;
        assert_eq!(got.size_bytes, 4096);
        assert_eq!(got.unknown["future"], true);
    }

    #[test]
    fn shared_between_threads() {
        let (_dir, cat) = open_temp();
        let cat = std::sync::Arc::new(cat);
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let cat = cat.clone();
                std::thread::spawn(move || {
                    for i in 0..10 {
                        cat.insert(&record(&format!("t{t}-{i}"), 4096)).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(cat.list().unwrap().len(), 40);
    }
}
