//! Unit tests of the host's pure helpers.

use std::path::Path;

use super::object_path;

#[test]
fn plain_names_are_file_names_and_others_are_hex_encoded() {
    let root = Path::new("/r");
    assert_eq!(
        object_path(root, "st", "Counter", "c-1_A"),
        Path::new("/r/st/Counter/c-1_A.sqlite")
    );
    // `~` marks the encoded form, so a plain name never collides with it.
    assert_eq!(
        object_path(root, "st", "Counter", "a b"),
        Path::new("/r/st/Counter/~612062.sqlite")
    );
    assert_eq!(
        object_path(root, "st", "Counter", ".."),
        Path::new("/r/st/Counter/~2e2e.sqlite")
    );
    let long = "é".repeat(120);
    let path = object_path(root, "st", "Counter", &long);
    assert!(path.starts_with("/r/st/Counter"));
    for part in path
        .strip_prefix("/r/st/Counter")
        .expect("under the class directory")
        .iter()
    {
        assert!(part.len() <= 207, "{part:?}");
    }
    assert_ne!(path, object_path(root, "st", "Counter", &"é".repeat(119)));
}
